"""Stage 3: jaxpr -> StableHLO with sharding annotations (GSPMD and Shardy)."""

from . import collectives as _collectives  # noqa: F401  (negative collective axes)
from . import region as _region  # noqa: F401  (registers the pmap region lowering)
from . import rules as _rules  # noqa: F401  (registers the MLIR lowering rules)
