"""Host callbacks: see values computed inside partitioned programs (seed ``host_callback``).

``id_tap(tap_func, arg)`` is the identity on ``arg`` that calls ``tap_func`` on the host
with a copy of it, in program order; ``id_print`` prints. A byte-bounded receiver runs the
tap functions on one thread (back pressure slows the program, never memory);
``barrier_wait()`` waits for every tap launched so far. ``call(f, arg, result_shape=)``
runs a host function whose result comes back into the program. A tap or call function
that raised is reported by the next ``barrier_wait()`` as ``CallbackException`` (the same
class as ``TapFunctionException``). docs/api.md describes them.
"""

from ._src.host_callback.api import (
    CallbackFlavor,
    barrier_wait,
    call,
    configure_receiver,
    id_print,
    id_tap,
    outfeed_receiver,
    receiver_stats,
)
from ._src.host_callback.receiver import CallbackException, TapFunctionException

__all__ = [
    "CallbackException",
    "CallbackFlavor",
    "TapFunctionException",
    "barrier_wait",
    "call",
    "configure_receiver",
    "id_print",
    "id_tap",
    "outfeed_receiver",
    "receiver_stats",
]
