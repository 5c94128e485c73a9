"""One checked spec and aval per leaf of a call's arguments, before tracing.

Why here and not in the front door: a front door only says *which* spec tree a
call uses (its options record); turning that tree into one checked spec per
leaf is the sharding stage's work, the same for every front door that
partitions over a mesh. A given spec is checked against the mesh and the
argument (a committed array must already be laid out so, as in jax.jit); an
omitted one is the argument's own layout; ``AUTO`` waits for the AUTO stage.
The avals come out in the memory kinds the arguments will live in, and typed
with their shardings over a mesh with Explicit axes (NOTE [explicit axes]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax.sharding import Mesh

from .. import jax_private as jp
from .auto import AUTO
from .checks import check_specs, given_specs
from .devices import DeviceSource
from .leaves import resolve_inputs
from .mesh_env import has_explicit_axes
from .parsed import REPLICATED
from .placement import (
    check_committed_layout,
    check_live,
    check_usable,
    unspecified_input_spec,
)
from .tree import UNSPECIFIED, broadcast_prefix

#: One spec per leaf: None where XLA chooses the layout (a tracer's, an omitted
#: output's), AUTO where the AUTO stage chooses it.
LeafSpec = Any


def input_specs(
    prefix: Any,
    dynamic_args: tuple[Any, ...],
    leaves: Sequence[Any],
    mesh: Mesh,
    where: Callable[[int], str],
    *,
    api: str,
    arg_name: str,
    check_committed: bool,
    keyword_spec: Any = REPLICATED,
    origin: DeviceSource | None = None,
    move_all: bool = False,
) -> list[LeafSpec]:
    """Broadcast the in-spec ``prefix`` over a call's positional arguments, one spec per leaf.

    Leaves past the positional ones (keyword arguments) get ``keyword_spec``
    (``UNSPECIFIED``: each as it is laid out); ``origin``: what put the call on
    ``mesh`` (jax's device messages name it). ``check_committed`` (unless the user allows resharding committed arrays):
    a committed argument must already be laid out as its given spec asks.
    ``move_all`` (``jit(device=...)``, a one-device ``mesh``): every argument is
    moved there, as jax.jit moves them.

    Raises:
        ValueError: the tree is not a prefix of the arguments; an argument
            committed outside the mesh, or laid out otherwise than its spec.
        RuntimeError: an argument was deleted (donated to an earlier call).
    """
    arg_specs, _ = broadcast_prefix(
        prefix, dynamic_args, api=f"{api} {arg_name}", what="positional arguments"
    )
    specs: list[LeafSpec] = []
    for i, leaf in enumerate(leaves):
        if jp.is_token(leaf):  # an ordering token holds no data: replicated, as jax's
            specs.append(REPLICATED)
            continue
        if move_all:
            check_live(leaf, where(i))
            specs.append(REPLICATED)
            continue
        check_usable(leaf, mesh, where(i), origin)
        spec = arg_specs[i] if i < len(arg_specs) else keyword_spec
        if spec is UNSPECIFIED:
            spec = unspecified_input_spec(leaf, mesh, where(i), api, origin)
        elif spec is not AUTO and check_committed:
            check_committed_layout(leaf, spec, mesh, where(i), api)
        specs.append(spec)
    return specs


def checked_inputs(
    specs: Sequence[LeafSpec],
    leaves: Sequence[Any],
    labels: Sequence[str],
    mesh: Mesh,
    where: Callable[[int], str],
    api: str,
    static_hint: str,
    fun: Any = None,
    *,
    auto_search: bool = False,
) -> tuple[tuple[LeafSpec, ...], tuple[Any, ...]]:
    """Each argument's aval; every given spec checked against the mesh and shapes; memory
    kinds and layouts settled. ``labels`` name the arguments as jax does (``x['w']``).
    ``auto_search``: the call has AUTO leaves (see :func:`abstractify`).

    Returns:
        ``(specs, avals)``: the avals in the memory kinds the arguments will live
        in (part of the traced types), the specs with the layouts they state.

    Raises:
        TypeError: an argument that is not a JAX type (``static_hint`` says how
            to mark it static).
        ValueError: every bad leaf at once (axis, rank, divisibility), or a
            memory kind or layout the argument does not have.
    """
    avals = [
        abstractify(x, where(i), static_hint, mesh=mesh, fun=fun, auto_search=auto_search)
        for i, x in enumerate(leaves)
    ]
    given = given_specs(specs, avals)
    check_specs(
        f"{api} arguments",
        [specs[i] for i in given],
        [where(i) for i in given],
        [f"pjit arguments with pytree key path {labels[i]}" for i in given],
        [avals[i].shape for i in given],
        mesh,
    )
    resolved, resolved_avals = resolve_inputs(
        api,
        [specs[i] for i in given],
        [leaves[i] for i in given],
        [avals[i] for i in given],
        lambda k: where(given[k]),
        mesh,
    )
    out_specs, out_avals = list(specs), list(avals)
    for k, i in enumerate(given):
        out_specs[i], out_avals[i] = resolved[k], resolved_avals[k]
    return tuple(out_specs), tuple(out_avals)


def abstractify(
    leaf: Any,
    where: str,
    static_hint: str,
    *,
    mesh: Mesh | None = None,
    fun: Any = None,
    auto_search: bool = False,
) -> Any:
    """The abstract value of an argument leaf of a call over ``mesh``, typed as jax.jit types it.

    Over a mesh with Explicit axes a value's sharding is part of its type (NOTE
    [explicit axes] in ``mesh_env.py``). Over an all-Auto mesh an array committed
    to that mesh names it in its type, with no axis in its spec (``jax.typeof``
    shows it so, outside the call and in jax.jit's body alike); other values, and
    every value of a call with no mesh (pmap's blocks), are untyped. So are the
    arguments of a call with AUTO leaves over an all-Auto mesh (``auto_search``):
    the search is made per program, and typed and untyped arguments make two (a
    training step on ``init``'s uncommitted state, then on its committed results,
    would search twice).

    Raises:
        TypeError: not a JAX type: jax.jit's message (``fun`` and the argument's
            path), then ``where`` (API and argument) and how to mark it static.
    """
    try:
        typed = jp.typed_abstractify(leaf)
    except TypeError:
        raise TypeError(
            f"Error interpreting argument to {fun} as an abstract array. The problematic "
            f"value is of type {type(leaf)} and was passed to the function at path "
            f"{where.rpartition('argument ')[2]}.\nThis typically means that a jit-wrapped "
            "function was called with a non-array argument, and this argument was not "
            "marked as static using the static_argnums or static_argnames parameters of "
            f"jax.jit.\n{where} of type {type(leaf).__name__} is not a valid JAX type "
            "(arrays, numpy arrays, Python scalars or jax.ShapeDtypeStruct). Mark it "
            f"static with {static_hint} if it is configuration."
        ) from None
    if mesh is None:
        return jp.shaped_abstractify(leaf)
    if has_explicit_axes(mesh) or (not auto_search and _names_mesh(typed, mesh)):
        return typed
    return jp.shaped_abstractify(leaf)


def _names_mesh(aval: Any, mesh: Mesh) -> bool:
    """Whether ``aval`` is typed over ``mesh`` (a value committed to it)."""
    typed_mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    return typed_mesh is not None and typed_mesh == mesh.abstract_mesh
