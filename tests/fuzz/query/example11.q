queue_pressure { @[queue_kind] = max(queue_depth) } task_assign { @d = hist(queue_depth) }
