task_begin, task_end /launch_mode == jit/ { @[hook, class] = count() }
