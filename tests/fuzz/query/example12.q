request /phase == token/ { @tok[req_slot, req_gen] = count() }
