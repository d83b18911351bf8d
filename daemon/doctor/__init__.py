"""``oom-sentinel doctor``: collected facts and the pure checks over them."""
