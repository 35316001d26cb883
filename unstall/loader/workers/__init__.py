"""An epoch's run on torch's worker processes: started at a position (`epoch_start`),
iterated (`iterate`: the epoch iterator, where a worker's death or a stuck start is met),
watched (`watchdog`, `stuck_start`), stopped (`worker_death`, `torch_shutdown`); every
private name of torch's DataLoader and iterator read or written in `torch_iter` alone.
"""
