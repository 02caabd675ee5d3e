task_end /op == gemv_residual/ { @ns[class] = sum(t_end - t_begin) }  # kernels name ops too
