"""Stage 2b: the transformation rules of our primitives, one module per primitive.

``pjit.py`` (``pjit_p``), ``constraint.py`` (``sharding_constraint_p``) and
``region.py`` (the pmap region) each hold every rule of their primitive (vmap,
jvp, transpose, partial eval, DCE), registered right after its definition, with
a banner per rule kind. The host callback's ``id_tap_p`` keeps the same scheme
in its own package. Importing this package registers them all.
"""

from . import constraint, pjit, region  # noqa: F401
