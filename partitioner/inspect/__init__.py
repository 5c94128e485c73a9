"""See what partitioning did: where values live, what XLA communicates, what it costs.

``report(f, *args)`` (also ``Lowered.report()`` / ``Compiled.report()``) gives the
tables: every input, output, ``with_sharding_constraint`` and residual with the
layout asked and chosen; the collectives XLA inserted, mapped back to mesh axes;
per-device memory and cost. ``compare_partitioners(f, *args)`` puts GSPMD's and
Shardy's results side by side; ``visualize(x)`` draws which device holds which
block of an array. ``python -m partitioner.inspect module:function --mesh data=4 --arg
f32[32,16] --in "P('data')"`` prints the report from a shell. ``residuals(fun, *args)`` reports the values
``jax.vjp`` keeps from each pjit inside ``fun``, with the layout XLA chose.
"""

from .._src.inspect.api import Comparison, compare_partitioners, report
from .._src.inspect.collectives import Collective
from .._src.inspect.tables import AutoTable, Cost, Memory, Report, ValueRow
from .._src.inspect.visualize import visualize
from .._src.residuals import Residual, residuals

__all__ = [
    "AutoTable",
    "Collective",
    "Comparison",
    "Cost",
    "Memory",
    "Report",
    "Residual",
    "ValueRow",
    "compare_partitioners",
    "report",
    "residuals",
    "visualize",
]
