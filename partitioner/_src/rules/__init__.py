"""Stage 2b: transformation rules for ``pjit_p`` and ``sharding_constraint_p``.

One module per rule kind; each rule is registered right after its definition.
Importing this package registers them all.
"""

from . import batching, dce, jvp, partial_eval, transpose  # noqa: F401
