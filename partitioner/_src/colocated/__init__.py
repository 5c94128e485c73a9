"""colocated_python: Python functions that run where their arguments' shards live (seed 002).

``objects`` (``colocated_python_class``: handles to objects built where their
calls run) -> ``api`` (the callable, its specializations and caches;
``colocated_cpu_devices``) -> ``layout`` (where the outputs live; each process's
blocks assembled into global arrays) -> ``runtime`` (the per-thread lanes and
the promised outputs). It takes each process's
host-local part of its arguments from ``distributed``, so it sits above the
front doors.
"""
