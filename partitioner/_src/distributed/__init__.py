"""Multi-process jobs on ``jax.distributed``: joining, the local launcher, host-local data.

``cluster`` (``initialize``, the lost-process watchdog) <- ``launcher`` (``python -m
partitioner.launch``); ``arrays`` (host-local <-> global arrays). pjit needs nothing
else: a mesh over every process's devices is an ordinary mesh to the pipeline, and
dispatch checks that every process runs the same program (``compiler/agreement.py``).
"""
