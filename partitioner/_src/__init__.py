"""partitioner's private pipeline (see docs/architecture.md): nothing here is public API."""
