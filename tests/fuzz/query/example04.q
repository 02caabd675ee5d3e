request /phase == finished/ { @[req_slot] = count() }
