task_end /tile_y >= 0 && tile_y < 2 || !(tile_z == -1)/ { @[tile_y, tile_z] = count() }
