task_end { @lat = lhist((t_end - t_begin) / 1000, 0, 100, 10); @m = min(t_begin - t_ready); @a = avg(wait_ns) }
