"""``report(f, *args)`` and ``compare_partitioners``: the report of a function's call.

The report itself comes from the AOT stages (``Compiled.report``, NOTE
[partitioning report]); what only a function and its arguments can add is the
residuals its ``jax.vjp`` keeps, laid out by XLA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import options
from ..residuals import residuals
from ..sharding.parsed import ParsedPartitionSpec
from .tables import Report, value_row


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
    if not leaves or any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
        return result  # abstract arguments: nothing to differentiate
    dtypes = [x.dtype if hasattr(x, "dtype") else np.result_type(x) for x in leaves]
    if not all(jax.dtypes.issubdtype(d, jnp.floating) for d in dtypes):
        return result  # integer or key arguments (typed PRNG keys): no vjp to take

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


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The same call compiled for GSPMD and for Shardy (``compare_partitioners``).

    ``rows`` are ``(what, gspmd, shardy)`` lines of the comparison: each kind of
    collective (count x bytes per device, over which axes), each memory figure
    and each output's chosen layout; ``differences`` are the rows that differ.
    """

    gspmd: Report
    shardy: Report
    rows: tuple[tuple[str, str, str], ...]

    @property
    def differences(self) -> tuple[tuple[str, str, str], ...]:
        return tuple(r for r in self.rows if r[1] != r[2])

    def __str__(self) -> str:
        width = max(len(w) for w, _, _ in self.rows) if self.rows else 4
        cols = [max(len(r[i]) for r in self.rows) if self.rows else 5 for i in (1, 2)]
        lines = [
            f"== {self.gspmd.name}: GSPMD vs Shardy ({len(self.differences)} difference(s), "
            "marked *) ==",
            f"   {'':<{width}}  {'GSPMD':<{cols[0]}}  {'Shardy':<{cols[1]}}",
        ]
        for what, a, b in self.rows:
            mark = "*" if a != b else " "
            lines.append(f" {mark} {what:<{width}}  {a:<{cols[0]}}  {b:<{cols[1]}}".rstrip())
        return "\n".join(lines)


def _collective_rows(r: Report) -> dict[str, str]:
    summary: dict[str, list[str]] = {}
    for c in r.collectives:
        summary.setdefault(c.kind, []).append(
            f"{c.count}x {c.bytes_per_device:,} B {c.describe_axes()}"
        )
    return {kind: "; ".join(sorted(v)) for kind, v in summary.items()}


def compare_partitioners(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Comparison:
    """Compile ``f(*args, **kwargs)`` for GSPMD and for Shardy and put the results side by side.

    Compared: the collectives of each kind, per-device memory, and each output's
    layout as XLA chose it. ``print`` the result; ``.differences`` lists what differs.

    Raises:
        TypeError: ``f`` is not a pjit- or pmap-ed function.
    """
    reports = {}
    for mode in ("gspmd", "shardy"):
        with options.spmd_partitioner(mode):
            reports[mode] = report(f, *args, **kwargs)
    g, s = reports["gspmd"], reports["shardy"]
    rows: list[tuple[str, str, str]] = []
    cg, cs = _collective_rows(g), _collective_rows(s)
    for kind in sorted(set(cg) | set(cs)):
        rows.append((f"collective {kind}", cg.get(kind, "-"), cs.get(kind, "-")))
    if not cg and not cs:
        rows.append(("collectives", "none", "none"))
    for field in ("arguments", "outputs", "temporaries", "aliased"):
        a = getattr(g.memory, field) if g.memory else None
        b = getattr(s.memory, field) if s.memory else None
        rows.append(
            (
                f"memory {field} (B/device)",
                f"{a:,}" if a is not None else "-",
                f"{b:,}" if b is not None else "-",
            )
        )
    outs_g = [v for v in g.values if v.kind == "output"]
    outs_s = {v.path: v for v in s.values if v.kind == "output"}
    for v in outs_g:
        other = outs_s.get(v.path)
        rows.append(
            (
                f"output {v.path} layout",
                v.spec_chosen or "-",
                other.spec_chosen or "-" if other else "-",
            )
        )
    return Comparison(g, s, tuple(rows))
