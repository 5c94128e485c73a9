"""Stage 3: jaxpr -> StableHLO with sharding annotations (GSPMD and Shardy)."""
