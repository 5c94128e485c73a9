"""Host callbacks: ``id_tap`` / ``id_print`` / ``call`` and the byte-bounded receiver (seeds 003, 004).

``api`` (what users call) -> ``primitive`` (``id_tap_p`` and its transformation
rules), ``call`` (``call_p`` and its rules) -> ``lowering`` (the host callbacks in
the compiled program; ``manual``: in manual regions) -> ``receiver`` (program
order, the bounded queue, the consumer thread). A tap plugs into the
pipeline as one more primitive: pjit, jax.jit and the control-flow primitives
lower it where it sits, with the ordered-effect token pjit already threads.
``registry`` wires them all into jax (imported here, so any import of the package
installs it).
"""

from . import registry as _registry  # noqa: F401  (installs the primitives' rules)
