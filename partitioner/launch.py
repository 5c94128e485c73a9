"""``python -m partitioner.launch -n N [--devices-per-process D] -- CMD ARGS...``.

Starts N local processes of one ``jax.distributed`` job (see
``partitioner/_src/distributed/launcher.py`` for what each child gets and how
failures are handled).
"""

import sys

from ._src.distributed.launcher import launch, main

__all__ = ["launch", "main"]

if __name__ == "__main__":
    sys.exit(main())
