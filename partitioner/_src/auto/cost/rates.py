"""The rates that turn work and traffic into time, for every model partitioner prices.

Why one module: AUTO's cost model (``walk.py``) and the pipeline's microbatch
choice (``_src/pipeline/microbatches.py``) compare plans by the same estimate of a
step's time; with two sets of rates a pipeline and a layout would be priced in
different currencies and the search could not weigh one against the other.
"""

from __future__ import annotations

#: Modelled floating-point rate of one device (FLOP/s).
FLOPS_PER_S = 1e11
#: Modelled collective bandwidth of one device (operand bytes/s).
BYTES_PER_S = 1e10
#: Modelled fixed cost of launching one collective (s): splitting a tiny vector to
#: save a few bytes is not worth a collective more.
LATENCY_S = 2e-6


def seconds(flops: float, collective_bytes: float, collectives: float) -> float:
    """The modelled time of ``flops`` of work and ``collectives`` moving ``collective_bytes``."""
    return flops / FLOPS_PER_S + collective_bytes / BYTES_PER_S + collectives * LATENCY_S
