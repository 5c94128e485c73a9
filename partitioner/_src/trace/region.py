"""The ``pmap`` region primitive: a per-device body run once on every device of an axis.

NOTE [pmap region]: ``pmap`` is a front door onto ``pjit_p``: its call is a pjit
over a one-axis mesh whose body holds a single ``pmap_region_p`` equation. The
region's params carry the *per-device* body: a jaxpr on **blocks** (each mapped
input's mapped dimension has size 1 there, as every device holds one slice)
that squeezes that dimension, runs the user's function with collectives bound
to the axis name, and expands each mapped output back. Outside, the region's
inputs and outputs are global arrays: a mapped input's dimension ``d`` is the
axis size; an unmapped (``None``) input is the same on every device; an
unmapped output is taken as the devices' common value (not checked, as in
jax.pmap). The lowering (``lower/region.py``) makes the body a manual-SPMD
computation over the axis; the rules (``rules/region.py``) transform the body
under the axis environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp

pmap_region_p = jp.Primitive("pmap_region")
pmap_region_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class RegionParams:
    """The parameters of one ``pmap_region_p`` equation (all hashable).

    Attributes:
        body: ClosedJaxpr on blocks (NOTE [pmap region]).
        axis_name: the mapped axis (the mesh's only axis).
        mesh: the one-axis mesh of the devices, in mapping order.
        in_dims / out_dims: per input / output, the mapped dimension or None.
        name: the user's function name.
    """

    body: jp.ClosedJaxpr
    axis_name: str
    mesh: Mesh
    in_dims: tuple[int | None, ...]
    out_dims: tuple[int | None, ...]
    name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_dims", tuple(self.in_dims))
        object.__setattr__(self, "out_dims", tuple(self.out_dims))
        if len(self.in_dims) != len(self.body.in_avals) or len(self.out_dims) != len(
            self.body.out_avals
        ):
            raise ValueError(
                f"internal error: pmap {self.name} region has {len(self.body.in_avals)} inputs and "
                f"{len(self.body.out_avals)} outputs but {len(self.in_dims)} and "
                f"{len(self.out_dims)} mapped dimensions; please report"
            )

    @property
    def size(self) -> int:
        return int(self.mesh.shape[self.axis_name])

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> RegionParams:
        return cls(**params)

    def replace(self, **changes: Any) -> RegionParams:
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def bind(self, *args: Any) -> Any:
        return pmap_region_p.bind(*args, **self.as_kwargs())

    def axis_env(self) -> Any:
        """The axis environment the body's collectives are traced and lowered in."""
        return jp.extend_axis_env_nd([(self.axis_name, self.size)])


def block_aval(aval: Any, dim: int | None) -> Any:
    """One device's block of a global value mapped at ``dim`` (size 1 there)."""
    if dim is None:
        return aval
    return aval.update(shape=(*aval.shape[:dim], 1, *aval.shape[dim + 1 :]))


def global_aval(aval: Any, dim: int | None, size: int) -> Any:
    """The global value whose blocks (mapped at ``dim`` over ``size`` devices) are ``aval``."""
    if dim is None:
        return aval
    return aval.update(shape=(*aval.shape[:dim], size, *aval.shape[dim + 1 :]))


def _abstract_eval(*avals: Any, **params: Any) -> tuple[list[Any], Any]:
    p = RegionParams.of(params)
    outs = [global_aval(a, d, p.size) for a, d in zip(p.body.out_avals, p.out_dims, strict=True)]
    return outs, p.body.effects


pmap_region_p.def_effectful_abstract_eval(_abstract_eval)


def _pp_rule(eqn: Any, context: Any, settings: Any) -> Any:
    params = dict(eqn.params)
    params["mesh"] = dict(params["mesh"].shape)
    return jp.pp_eqn(eqn.replace(params=params), context, settings)


jp.pp_eqn_rules[pmap_region_p] = _pp_rule
