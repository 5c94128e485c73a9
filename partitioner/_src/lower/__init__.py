"""Stage 4: jaxpr -> StableHLO with sharding annotations (GSPMD and Shardy)."""

from . import collectives as _collectives  # noqa: F401  (negative collective axes)
