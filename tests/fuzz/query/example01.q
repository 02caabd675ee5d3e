dep_wait /wait_ns > 20us/ { @[event_class] = count() }
