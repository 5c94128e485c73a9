"""Sharding annotations in StableHLO, for GSPMD and for Shardy, from one spec.

Every attribute here is computed by partitioner's own spec -> sharding code
(``sharding/op_sharding.py``); jax's ``NamedSharding`` is never consulted.

NOTE [device positions]: shardings name devices by their position in the
module's device assignment. In a module partitioner builds, that assignment is
``mesh.devices.flat``, so positions are the identity. When a pjit is lowered
inside someone else's module (``jax.jit``), the assignment may list the same
devices in another order: ``positions[i]`` is where mesh device ``i`` sits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from ..sharding.op_sharding import get_aval_sharding_proto
from ..sharding.parsed import ParsedPartitionSpec

#: The sdy.mesh symbol partitioner uses in modules it builds.
MESH_SYMBOL = "mesh"


def op_sharding(
    aval: Any, spec: ParsedPartitionSpec, mesh: Mesh, positions: Sequence[int] | None = None
) -> Any:
    """Our OpSharding for ``spec``, renumbered to module positions (NOTE [device positions])."""
    return get_aval_sharding_proto(aval, spec, mesh, encoding="iota", device_positions=positions)


def gspmd_attr(
    aval: Any, spec: ParsedPartitionSpec, mesh: Mesh, positions: Sequence[int] | None = None
) -> Any:
    """``mhlo.sharding`` string attribute, e.g. ``"{devices=[4,1,2]<=[8] last_tile_dim_replicate}"``."""
    return jp.StringAttr.get(
        str(jp.HloSharding.from_proto(op_sharding(aval, spec, mesh, positions)))
    )


# --- Shardy attributes, built as jax builds its own (named_sharding.SdyArray.build) ---


def sdy_sharding_attr(ndim: int, spec: Any, mesh_symbol: str = MESH_SYMBOL) -> Any:
    """The ``#sdy.sharding`` of ``spec`` for a rank-``ndim`` value, over the mesh op named
    ``mesh_symbol``: e.g. ``#sdy.sharding<@mesh, [{"a"}, {?}, {}]>``.

    An unconstrained dimension is open with no axes (``{?}``: XLA picks); every other
    dimension is closed, so XLA neither adds axes to it nor drops them. ``spec`` is a
    ParsedPartitionSpec or anything that coerces to one (UNCONSTRAINED allowed).
    Needs an MLIR context with the sdy dialect (any lowering's).
    """
    parsed = ParsedPartitionSpec.coerce(spec, "sdy_sharding_attr", allow_unconstrained=True)
    parts = list(parsed.partitions) + [()] * (ndim - len(parsed.partitions))
    dims = [
        jp.DimensionShardingAttr.get([], is_closed=False)
        if d in parsed.unconstrained_dims
        else jp.DimensionShardingAttr.get(
            [jp.AxisRefAttr.get(str(a)) for a in axes], is_closed=True
        )
        for d, axes in enumerate(parts)
    ]
    return jp.TensorShardingAttr.get(mesh_symbol, dims)


def sdy_mesh_attr(mesh: Mesh, positions: Sequence[int] | None = None) -> Any:
    """The ``#sdy.mesh`` of ``mesh``: ``<["a"=2, "b"=4]>``, with ``device_ids`` only when
    ``positions`` (NOTE [device positions]) is not the identity.

    Without ``device_ids`` the executable's device assignment is the flattened mesh, so
    logical device ``i`` is position ``i`` (Shardy rejects an explicit identity list).
    """
    axes = [jp.MeshAxisAttr.get(str(name), size) for name, size in mesh.shape.items()]
    if positions is not None and list(positions) != list(range(len(positions))):
        return jp.MeshAttr.get(axes, list(positions))
    return jp.MeshAttr.get(axes)


def shardy_attr(aval: Any, spec: ParsedPartitionSpec, mesh_symbol: str) -> Any:
    """``sdy.sharding`` attribute of ``spec`` for a value of ``aval``."""
    return sdy_sharding_attr(len(aval.shape), spec, mesh_symbol)


def ensure_sdy_mesh(module: Any, mesh: Mesh, positions: Sequence[int] | None = None) -> str:
    """Insert an ``sdy.mesh`` op for ``mesh`` at the top of ``module`` (once); return its symbol.

    Reuses an existing mesh op with the same definition; picks a fresh symbol when
    ``mesh`` (or its device order) differs from the one already named ``mesh``.
    """
    with module.context:
        wanted = sdy_mesh_attr(mesh, positions)
        existing = {}
        for op in module.body.operations:
            if op.operation.name == "sdy.mesh":
                existing[jp.StringAttr(op.attributes["sym_name"]).value] = op.attributes["mesh"]
        for name, definition in existing.items():
            if definition == wanted:
                return name
        symbol, k = MESH_SYMBOL, 0
        while symbol in existing:
            k += 1
            symbol = f"{MESH_SYMBOL}_{k}"
        with jp.InsertionPoint.at_block_begin(module.body), jp.Location.unknown():
            jp.MeshOp(symbol, wanted)
    return symbol


Side = tuple[str, tuple[Any, ...], tuple[ParsedPartitionSpec | None, ...]]


@dataclass(frozen=True)
class MainValues:
    """``main``'s arguments and results: each one's aval and its spec (None: XLA chooses).

    Why one record: shardings, memory kinds, layouts and donation all read the
    four sequences together, ``in_specs[i]`` with ``in_avals[i]`` (ordered-effect
    tokens are not among them).
    """

    in_avals: tuple[Any, ...]
    in_specs: tuple[ParsedPartitionSpec | None, ...]
    out_avals: tuple[Any, ...]
    out_specs: tuple[ParsedPartitionSpec | None, ...]

    def sides(self) -> tuple[Side, Side]:
        """``(attributes key, avals, specs)`` for ``main``'s arguments, then its results."""
        arguments = ("arg_attrs", self.in_avals, self.in_specs)
        return arguments, ("res_attrs", self.out_avals, self.out_specs)


def set_main_shardings(module: Any, values: MainValues, mesh: Mesh, shardy: bool) -> None:
    """Attach one sharding per argument and result of ``main``.

    A ``None`` spec leaves that value unannotated, so XLA's propagation picks
    its sharding (used for residuals, which are never forced to replicate).
    Ordered effects give ``main`` leading token arguments and results (jax's
    calling convention); tokens carry no sharding.
    """
    main = find_main(module)
    key = "sdy.sharding" if shardy else "mhlo.sharding"
    symbol = ensure_sdy_mesh(module, mesh) if shardy else ""

    built: dict[tuple[Any, ...], Any] = {}  # values share a few layouts: each built once

    def attr(aval: Any, spec: ParsedPartitionSpec) -> Any:
        # Shardings cover the physical shape: a key array's trailing dims are replicated.
        aval = jp.physical_aval(aval)
        key = (aval.shape, spec)
        if key not in built:
            built[key] = shardy_attr(aval, spec, symbol) if shardy else gspmd_attr(aval, spec, mesh)
        return built[key]

    def merged(
        old: Any, n_tokens: int, avals: Sequence[Any], specs: Sequence[ParsedPartitionSpec | None]
    ) -> Any:
        dicts = []
        for i, (aval, spec) in enumerate(
            [(None, None)] * n_tokens + list(zip(avals, specs, strict=True))
        ):
            entries = {} if old is None else {n.name: n.attr for n in jp.DictAttr(old[i])}  # type: ignore[attr-defined]
            if spec is not None and not jp.is_token(aval):  # a token carries no sharding
                entries[key] = attr(aval, spec)
            dicts.append(jp.DictAttr.get(entries))
        return jp.ArrayAttr.get(dicts)

    attrs = main.attributes
    counts = {  # values of main, leading ordered-effect tokens included
        "arg_attrs": len(main.regions[0].blocks[0].arguments),
        "res_attrs": len(jp.FunctionType(jp.TypeAttr(attrs["function_type"]).value).results),
    }
    for side, avals, specs in values.sides():
        old = attrs[side] if side in attrs else None
        attrs[side] = merged(old, counts[side] - len(avals), avals, specs)


def add_value_attrs(
    main: Any, key: str, n_values: int, entries_of: Callable[[int], dict[str, Any]]
) -> None:
    """Add ``entries_of(i)`` to the attributes of ``main``'s value ``i``.

    ``key`` is ``"arg_attrs"`` (arguments) or ``"res_attrs"`` (results), already set
    one per value by :func:`set_main_shardings`; the last ``n_values`` are the
    values, the leading ones ordered-effect tokens, left as they are. The one
    place attributes are added after lowering (donors, names, memory kinds, layouts).
    """
    attrs = main.attributes
    old = list(jp.ArrayAttr(attrs[key]))
    n_tokens = len(old) - n_values
    dicts = []
    for i, d in enumerate(old):
        entries = {n.name: n.attr for n in jp.DictAttr(d)}  # type: ignore[attr-defined]
        if i >= n_tokens:
            entries.update(entries_of(i - n_tokens))
        dicts.append(jp.DictAttr.get(entries))
    attrs[key] = jp.ArrayAttr.get(dicts)


def set_arg_names(main: Any, names: Sequence[str]) -> None:
    """Name ``main``'s arguments (``jax.arg_info = "params['w1']"``) where a name is known.

    Beyond jax.jit, which keeps argument names only in debug locations: the
    text a user reads says which value is which. XLA ignores the attribute.
    """
    if any(names):
        add_value_attrs(
            main,
            "arg_attrs",
            len(names),
            lambda i: {"jax.arg_info": jp.StringAttr.get(names[i])} if names[i] else {},
        )


def find_main(module: Any) -> Any:
    for op in module.body.operations:
        if "sym_name" in op.attributes and jp.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    raise AssertionError("internal error: lowered module has no main function")


def constrain(
    ctx: Any,
    value: Any,
    aval: Any,
    spec: ParsedPartitionSpec,
    mesh: Mesh,
    shardy: bool,
    positions: Sequence[int] | None = None,
) -> Any:
    """Wrap ``value`` in a sharding constraint (``{?}``/``unspecified_dims`` for open dims)."""
    aval = jp.physical_aval(aval)  # the IR value is physical (typed PRNG keys)
    if shardy:
        symbol = ensure_sdy_mesh(ctx.module_context.module, mesh, positions)
        return jp.sdy_sharding_constraint(value, shardy_attr(aval, spec, symbol))
    proto = op_sharding(aval, spec, mesh, positions)
    return jp.wrap_with_sharding_op(
        ctx, value, aval, proto, unspecified_dims=set(spec.unconstrained_dims) or None
    )


def mark_buffer_donors(main: Any, n_inputs: int, donors: Sequence[int]) -> None:
    """Give XLA the buffers of inputs ``donors`` (of ``n_inputs``) to reuse as it likes.

    ``jax.jit`` donates an input no output can alias (another shape of the same
    size, e.g. ``(16, 1)`` into ``(16,)``) as a *buffer donor*: XLA may reuse its
    memory, and the caller's array is consumed.
    """
    if donors:
        add_value_attrs(
            main,
            "arg_attrs",
            n_inputs,
            lambda i: {"jax.buffer_donor": jp.BoolAttr.get(True)} if i in donors else {},
        )
