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
from collections.abc import Sequence
from typing import Any, ClassVar

from jax.sharding import Mesh, PartitionSpec

from .. import jax_private as jp
from ..sharding.parsed import ParsedPartitionSpec
from .memo import ByIdentity, cache_per_jaxpr
from .params import PrimitiveParams
from .primitive import PjitParams

pmap_region_p = jp.Primitive("pmap_region")
pmap_region_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class RegionParams(PrimitiveParams):
    """The parameters of one ``pmap_region_p`` equation (all hashable).

    Attributes:
        body: ClosedJaxpr on blocks (NOTE [pmap region]).
        axis_name: the mapped axis (the mesh's only axis).
        mesh: the one-axis mesh of the devices, in mapping order.
        in_dims / out_dims: per input / output, the mapped dimension or None.
        name: the user's function name.

    Invariant: one mapped dimension (or None) per body input and per body output.
    """

    primitive: ClassVar[jp.Primitive] = pmap_region_p
    tuple_fields: ClassVar[tuple[str, ...]] = ("in_dims", "out_dims")

    body: jp.ClosedJaxpr
    axis_name: str
    mesh: Mesh
    in_dims: tuple[int | None, ...]
    out_dims: tuple[int | None, ...]
    name: str

    def check(self) -> None:
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


def mapped_spec(axis_name: str, dim: int | None) -> ParsedPartitionSpec:
    """The global layout of a value mapped at ``dim`` over ``axis_name`` (replicated for None)."""
    entries = () if dim is None else (*([None] * dim), axis_name)
    return ParsedPartitionSpec.coerce(PartitionSpec(*entries), "pmap")


def region_pjit(
    region: RegionParams,
    consts: Sequence[Any],
    in_avals: Sequence[Any],
    donated: Sequence[bool],
) -> PjitParams:
    """A pjit over the region's mesh whose body is the region (NOTE [pmap region]).

    The region's first ``len(consts)`` inputs are ``consts``, closed into the body;
    the pjit takes the rest (``in_avals``), each laid out as the region maps it.
    Built once per region body and signature (NOTE [derived jaxpr cache]), so every
    plan of the same call reaches the executable cache with the same program.
    """
    rest = (region.axis_name, region.mesh, region.in_dims, region.out_dims, region.name)
    return _region_pjit(region.body, rest, ByIdentity(consts), tuple(in_avals), tuple(donated))


@cache_per_jaxpr
def _region_pjit(
    body: Any,
    rest: tuple[Any, ...],
    consts: ByIdentity,
    in_avals: tuple[Any, ...],
    donated: tuple[bool, ...],
) -> PjitParams:
    region = RegionParams(body, *rest)

    def call(*xs: Any) -> Any:
        return region.bind(*consts.values, *xs)

    debug_info = jp.debug_info("pmap", call, in_avals, {})
    jaxpr, _, closed = jp.trace_to_jaxpr_dynamic(
        jp.wrap_init(call, debug_info=debug_info), list(in_avals)
    )
    jaxpr = jaxpr.replace(debug_info=_named_as_body(jaxpr.debug_info, body, len(in_avals)))
    return PjitParams(
        jaxpr=jp.ClosedJaxpr(jaxpr, closed),
        in_axis_resources=tuple(
            mapped_spec(region.axis_name, d) for d in region.in_dims[len(consts.values) :]
        ),
        out_axis_resources=tuple(mapped_spec(region.axis_name, d) for d in region.out_dims),
        mesh=region.mesh,
        donated_invars=donated,
        name=region.name,
        api="pmap",
    )


def _named_as_body(debug: Any, body: Any, n_in: int) -> Any:
    """``debug`` with the argument and result names of the region's body (the user's names).

    The pjit around a region takes the body's last ``n_in`` inputs, so its module
    names them as the user's function does (``jax.arg_info``, ``jax.result_info``).
    """
    named = body.jaxpr.debug_info
    if named is None or debug is None:
        return debug
    names = tuple(named.arg_names or ())
    names = ((None,) * n_in + names)[-n_in:] if n_in else ()
    return debug._replace(arg_names=names, result_paths=named.result_paths)


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
