task_ready { @q[event_class] = max(event_count) }
