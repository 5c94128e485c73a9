"""See what partitioning did: where values live, what XLA communicates, what it costs.

``report(f, *args)`` (also ``Lowered.report()`` / ``Compiled.report()``) gives the
tables: every input, output, ``with_sharding_constraint`` and residual with the
layout asked and chosen; the collectives XLA inserted, mapped back to mesh axes;
per-device memory and cost. ``residuals(fun, *args)`` reports the values
``jax.vjp`` keeps from each pjit inside ``fun``, with the layout XLA chose.
"""

from ._src.inspection import report
from ._src.report.collectives import Collective
from ._src.report.tables import Cost, Memory, Report, ValueRow
from ._src.residuals import Residual, residuals

__all__ = ["Collective", "Cost", "Memory", "Report", "Residual", "ValueRow", "report", "residuals"]
