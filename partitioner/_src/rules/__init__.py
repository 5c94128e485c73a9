"""Stage 2b: transformation rules for ``pjit_p``, ``sharding_constraint_p`` and the pmap region.

One module per rule kind; each rule is registered right after its definition.
Importing this package registers them all.
"""

from . import batching, dce, jvp, partial_eval, region, transpose  # noqa: F401
