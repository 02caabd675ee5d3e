task_end /event_class == "attn->wo"/ { @n = count() }
