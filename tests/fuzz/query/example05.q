step { @[batch_size] = count() }
