task_end { @p99[class] = quantile(t_end - t_begin, 0.99) }
