"""``partitioner.inspect.report``: the partitioning report of a pjit- or pmap-ed call.

The report itself comes from the AOT stages (``Compiled.report``, NOTE
[partitioning report]); what only a function and its arguments can add is the
residuals its ``jax.vjp`` keeps, laid out by XLA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .report.tables import Report, value_row
from .residuals import residuals
from .spec.parsed import ParsedPartitionSpec


def report(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Report:
    """What partitioning does to ``f(*args, **kwargs)``: values, collectives, memory, cost.

    ``f`` is a pjit- or pmap-ed function; it is lowered and compiled for these
    arguments (arrays or ``jax.ShapeDtypeStruct``s), not run. When every argument
    is a float array, the values table also lists the residuals ``jax.vjp(f)``
    keeps (their layouts as XLA chose them).

    Raises:
        TypeError: ``f`` is not a pjit- or pmap-ed function.
    """
    lower = getattr(f, "lower", None)
    if not callable(lower):
        raise TypeError(
            f"report: expected a pjit- or pmap-ed function (it has .lower), got {f!r}; wrap it "
            "with partitioner.pjit first"
        )
    compiled = lower(*args, **kwargs).compile()
    result = compiled.report()
    leaves = jax.tree.leaves((args, kwargs))
    differentiable = leaves and all(
        jnp.issubdtype(getattr(x, "dtype", jnp.asarray(x).dtype), jnp.floating) for x in leaves
    )
    if not differentiable or any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
        return result
    mesh = compiled.executable.lowered.mesh
    rows = [
        value_row(
            "residual",
            f"{r.pjit_name}[{r.index}]",
            jax.core.ShapedArray(r.shape, r.dtype),
            None,
            ParsedPartitionSpec.coerce(r.spec, "report"),
            mesh,
        )
        for r in residuals(f, *args, **kwargs)
    ]
    return result.with_values(rows)
