"""Inspection: where partitioner's values live.

Why: users asked jax for years which layout XLA picked for the values a
backward pass keeps (residuals). partitioner leaves those layouts to XLA (NOTE
[residual shardings] in primitives/pjit_call.py) and can read them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from . import jax_private as jp
from .compiler.cache import get_executable
from .compiler.executable import bytes_per_device
from .primitives.pjit_call import PjitParams, pjit_p
from .sharding.partition_spec import Spec


@dataclass(frozen=True)
class Residual:
    """One value the forward pass of a pjit keeps for its backward pass.

    Attributes:
        pjit_name: the forward pjit that produces it, named as jax's transformations
            name it: ``'jvp(mlp)'`` for a pjit-ed ``mlp`` under ``jax.vjp``/``grad``.
        index: its position among that forward pjit's outputs, counting the primal
            outputs first: a function with one output has its residuals at 1, 2, ...
        shape: the value's global shape.
        dtype: the value's dtype.
        spec: the layout XLA chose for it (residuals are never forced to replicate).
        nbytes_per_device: the bytes one device holds.
    """

    pjit_name: str
    index: int
    shape: tuple[int, ...]
    dtype: Any
    spec: Spec
    nbytes_per_device: int

    def __str__(self) -> str:
        return f"{self.pjit_name}[{self.index}]: {self.dtype}{list(self.shape)} {self.spec} ({self.nbytes_per_device} B/device)"


def _forward_eqns(jaxpr: Any) -> list[PjitParams]:
    """The params of every forward-half pjit in ``jaxpr``, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is pjit_p:
            params = PjitParams.of(eqn.params)
            if None in params.out_axis_resources:
                found.append(params)
    for sub in jp.subjaxprs(jaxpr):
        found.extend(_forward_eqns(sub))
    return found


def residuals(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Residual]:
    """The residuals ``jax.vjp(fun, *args)`` keeps from each pjit inside ``fun``.

    Each forward-half pjit is compiled exactly as dispatch would compile it
    (same cache), and its residual outputs' layouts are parsed from the
    executable. Needs the mesh in context, like calling ``fun``.
    """
    closed = jax.make_jaxpr(lambda *a: jax.vjp(lambda *b: fun(*b, **kwargs), *a))(*args)
    out: list[Residual] = []
    for params in _forward_eqns(closed.jaxpr):
        executable, _ = get_executable(params)
        for i, (requested, chosen, aval) in enumerate(
            zip(
                params.out_axis_resources,
                executable.out_specs,
                params.jaxpr.out_avals,
                strict=True,
            )
        ):
            if requested is None:
                out.append(
                    Residual(
                        params.name,
                        i,
                        tuple(aval.shape),
                        aval.dtype,
                        chosen.to_partition_spec(),
                        bytes_per_device(aval, chosen, params.mesh),
                    )
                )
    return out
