dep_wait /wait_reason == step_end/ { @[worker] = count() }
