"""Stage 2: the pjit and sharding-constraint primitives and tracing to jaxprs."""
