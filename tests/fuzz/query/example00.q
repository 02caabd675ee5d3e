task_end /op == attn && req_gen == 1842/ { @us[tile_z] = hist((t_end - t_begin) / 1000) }
