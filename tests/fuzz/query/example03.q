task_end /class =~ "blk.*.wo"/ { @[worker] = sum(t_end - t_begin) }
