"""colocated_python: Python functions that run where their arguments' shards live (seed 002).

``api`` (the callable, its specializations and caches) -> ``layout`` (where the
outputs live; each process's blocks assembled into global arrays) -> ``runtime``
(the per-device-list worker and the promised outputs). It takes each process's
host-local part of its arguments from ``distributed``, so it sits above the
front doors.
"""
