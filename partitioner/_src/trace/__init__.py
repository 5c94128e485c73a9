"""Stage 2: reading a call (the one binder) and tracing a body to a jaxpr, once per signature."""
