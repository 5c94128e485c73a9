"""Memory kinds in the lowered module: ``mhlo.memory_kind`` on ``main``, and the moves.

NOTE [memory kinds]: a value's memory space (device HBM, pinned or unpinned
host memory) reaches XLA in two ways, as ``jax.jit`` sends it: each argument and
result of ``main`` carries an ``mhlo.memory_kind`` attribute, and each result
whose kind the caller *stated* (a NamedSharding leaf in the output specs) passes
through an ``annotate_device_placement`` custom call, XLA's marker for "move
this buffer to that memory". A result whose spec states no kind (a
PartitionSpec or ``None`` leaf) takes the kind the body gave it: a
``jax.device_put(x, sharding_with_memory_kind)`` inside the body types its
result ``float32<host>[...]``, and that memory space is the result's. When every
value lives in the default memory nothing is added, so ordinary programs lower
exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import jax_private as jp
from .annotate import MainValues, add_value_attrs

PLACEMENT_TARGET = "annotate_device_placement"

MSG_DEVICE_PUT_DEVICES = """\
{api} {name}: received incompatible devices: a jax.device_put inside the body targets \
devices {got}, but the computation runs on the mesh's devices {mesh_ids} (jax.jit refuses \
this too). Inside a pjit, device_put may change a value's layout and memory kind, not its \
devices: use a sharding over the mesh, e.g. NamedSharding(mesh, spec, \
memory_kind="pinned_host"), or jax.memory.Space.Host."""


@dataclass(frozen=True)
class MemoryKinds:
    """The memory kind of each input and output of ``main`` (tokens excluded)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    moved: tuple[bool, ...]  # outputs whose kind the spec states: moved there explicitly


def _aval_kind(aval: Any) -> str:
    space = getattr(aval, "memory_space", None)
    return "device" if space is None else jp.mem_space_to_kind(space)


def _moves_memory(jaxpr: Any, default_kind: str) -> bool:
    """Whether a ``device_put`` in ``jaxpr`` (or a sub-jaxpr) targets a non-default memory."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is jp.device_put_p:
            for d in eqn.params["devices"]:
                if isinstance(d, jp.MemorySpace):
                    kind = jp.mem_space_to_kind(d)
                else:
                    kind = getattr(d, "memory_kind", None) or default_kind
                if kind != default_kind:
                    return True
    return any(_moves_memory(sub, default_kind) for sub in jp.subjaxprs(jaxpr))


def _device_put_targets(jaxpr: Any) -> list[Any]:
    """Every sharding a ``device_put`` in ``jaxpr`` (or a sub-jaxpr) targets."""
    found = [
        d
        for eqn in jaxpr.eqns
        if eqn.primitive is jp.device_put_p
        for d in eqn.params["devices"]
        if hasattr(d, "device_set")
    ]
    for sub in jp.subjaxprs(jaxpr):
        found += _device_put_targets(sub)
    return found


def check_device_put_devices(jaxpr: Any, device_ids: Sequence[int], api: str, name: str) -> None:
    """A ``device_put`` inside the body may not move values off the computation's devices.

    Raises:
        ValueError: a target sharding over other devices (as ``jax.jit`` raises).
    """
    wanted = set(device_ids)
    for target in _device_put_targets(jaxpr):
        got = sorted(d.id for d in target.device_set)
        if set(got) != wanted:
            raise ValueError(
                MSG_DEVICE_PUT_DEVICES.format(api=api, name=name, got=got, mesh_ids=sorted(wanted))
            )


def memory_kinds(values: MainValues, jaxpr: Any, default_kind: str) -> MemoryKinds | None:
    """Each value's memory kind; None when everything lives in ``default_kind``."""
    ins, outs = (
        tuple(
            s.memory_kind if s is not None and s.memory_kind else _aval_kind(a)
            for a, s in zip(avals, specs, strict=True)
        )
        for _, avals, specs in values.sides()
    )
    moved = tuple(s is not None and s.memory_kind is not None for s in values.out_specs)
    if all(k == default_kind for k in ins + outs) and not _moves_memory(jaxpr.jaxpr, default_kind):
        return None
    return MemoryKinds(ins, outs, moved)


def annotate_memory_kinds(main: Any, kinds: MemoryKinds) -> None:
    """Mark ``main``'s arguments and results with their kinds; move stated results there.

    ``main``'s argument and result attributes are already set (one per value,
    leading ordered-effect tokens included, ``annotate.set_main_shardings``).
    """
    for key, values in (("arg_attrs", kinds.inputs), ("res_attrs", kinds.outputs)):

        def memory_kind(i: int, values: Sequence[str] = values) -> dict[str, Any]:
            return {"mhlo.memory_kind": jp.StringAttr.get(values[i])}

        add_value_attrs(main, key, len(values), memory_kind)
    n_tokens_out = len(jp.ArrayAttr(main.attributes["res_attrs"])) - len(kinds.outputs)
    if not any(kinds.moved):
        return
    ret = main.regions[0].blocks[0].operations[-1]  # func.return
    with jp.InsertionPoint(ret), ret.location:
        for j, (kind, moved) in enumerate(zip(kinds.outputs, kinds.moved, strict=True)):
            if not moved:
                continue
            value = ret.operands[n_tokens_out + j]
            op = jp.custom_call(
                PLACEMENT_TARGET,
                result_types=[value.type],
                operands=[value],
                has_side_effect=True,
                api_version=1,
            )
            op.attributes["mhlo.frontend_attributes"] = jp.DictAttr.get(
                {"_xla_buffer_placement": jp.StringAttr.get(kind)}
            )
            ret.operands[n_tokens_out + j] = op.result
