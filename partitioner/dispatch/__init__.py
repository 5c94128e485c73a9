"""Stage 5: executable cache, argument placement and execution."""
