"""Stage 4: jaxpr -> StableHLO with sharding annotations (GSPMD and Shardy)."""
