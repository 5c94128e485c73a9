"""Spec trees: parse every leaf, and broadcast a prefix tree over a value tree.

Why our own prefix matching: errors must name the *key path* where the spec tree
and the argument tree part ways (``in_axis_resources[1]['w']``), and spec trees
treat ``None`` as a leaf (replicated) while value trees treat it as an empty node.
An empty container (``()``, ``{}``, optax's ``EmptyState()``) is a node with no
leaves on both sides: it matches the same empty node. A list matches a list and
a tuple a tuple; only pjit's ``in_axis_resources`` reads its *top-level* list as
the tuple of arguments (as ``jax.jit`` does), and it converts that itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import KeyPath, keystr

from .auto import AUTO
from .checks import raise_all
from .devices import INPUT_SHARDING
from .leaves import SHARDING_LEAVES, leaf_mesh
from .parsed import ParsedPartitionSpec
from .partition_spec import is_spec

MSG_NOT_A_PREFIX = """\
{api}: the spec tree is not a pytree prefix of the {what} at {path}: {detail}.
Specs must mirror the structure of the {what} (or a prefix of it, one spec standing for a
whole subtree). For arguments, pass one spec per positional argument: a tuple such as
(PartitionSpec('x'), None) for f(x, y)."""

MSG_ARGS_TUPLE = """\
{api} specification must be a tree prefix of the positional arguments tuple. In particular, \
{api} must either be a Sharding, a PartitionSpec, or a tuple of length equal to the number \
of positional arguments. But {api} {problem}."""


class _Unspecified:
    """A spec leaf the caller left open: inputs as laid out, outputs as XLA propagates.

    Signatures show it as the default of every spec argument (``in_shardings=UNSPECIFIED``
    in ``help(partitioner.jit)`` and the API reference): users get it by leaving the
    argument out, never by naming it, so its repr is the one word the docs explain.
    """

    def __repr__(self) -> str:
        return "UNSPECIFIED"


#: An omitted spec (``jax.jit``'s ``None``; an omitted ``in_shardings``/``out_shardings``).
UNSPECIFIED: Any = _Unspecified()


def is_spec_leaf(x: Any) -> bool:
    """Leaves of a spec tree: specs, jax shardings and Formats, parsed specs, ``None``,
    UNSPECIFIED and AUTO."""
    return (
        x is None
        or x is UNSPECIFIED
        or x is AUTO
        or is_spec(x)
        or isinstance(x, (ParsedPartitionSpec, *SHARDING_LEAVES))
    )


def prepare_axis_resources(
    tree: Any,
    arg_name: str,
    *,
    allow_unconstrained: bool = False,
    none_is_unspecified: bool = False,
    allow_auto: bool = False,
    keyword: str | None = None,
) -> Any:
    """Parse every leaf of a spec tree into a :class:`ParsedPartitionSpec`.

    ``None`` leaves become :data:`REPLICATED` (pjit's reading) or, with
    ``none_is_unspecified``, :data:`UNSPECIFIED` (``jax.jit``'s reading);
    UNSPECIFIED leaves stay so, and so do AUTO leaves where ``allow_auto`` (pjit's
    and jit's own in/out specs; anywhere else AUTO is a TypeError). A NamedSharding
    stands for its spec (:func:`meshes_named_by` finds its mesh). Anything that is not a spec,
    ``None`` or a container is rejected with a TypeError naming its path.

    Args:
        arg_name: ``"{api} {keyword}"`` (``"jit f in_shardings"``): names each leaf's path.
        keyword: the option as jax's messages name it (``"in_shardings"``; jax's
            with_sharding_constraint says ``"shardings"``); default: the last
            word of ``arg_name``.
    """
    keyword = keyword or arg_name.rsplit(" ", 1)[-1]

    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_spec_leaf)
    parsed: list[Any] = []
    errors: list[Exception] = []
    for path, leaf in leaves:
        if leaf is UNSPECIFIED or (leaf is None and none_is_unspecified):
            parsed.append(UNSPECIFIED)
            continue
        if leaf is AUTO:
            if allow_auto:
                parsed.append(AUTO)
            else:
                errors.append(
                    TypeError(
                        f"{arg_name}{keystr(path)}: AUTO is a layout partitioner chooses for a "
                        "pjit/jit input or output; here give a PartitionSpec."
                    )
                )
            continue
        try:
            parsed.append(
                ParsedPartitionSpec.coerce(
                    leaf,
                    f"{arg_name}{keystr(path)}",
                    allow_unconstrained=allow_unconstrained,
                    keyword=keyword,
                )
            )
        except (TypeError, ValueError) as e:
            errors.append(e)
    raise_all(errors, arg_name)
    return jax.tree_util.tree_unflatten(treedef, parsed)


def has_bare_specs(tree: Any) -> bool:
    """Whether a spec tree has a PartitionSpec leaf: a spec with no mesh of its own.

    Only a mesh in context gives such a spec a meaning; as in jax, a NamedSharding
    beside it does not lend it its mesh (``mesh_env.resolve_call_mesh``).
    """
    return any(is_spec(leaf) for leaf in jax.tree_util.tree_leaves(tree, is_leaf=is_spec_leaf))


def meshes_named_by(
    tree: Any, arg_name: str, kind: str = INPUT_SHARDING
) -> list[tuple[str, Any, str]]:
    """``(where, mesh, kind)`` of every leaf of a spec tree that names devices, in tree order.

    ``kind`` says what the tree is, as jax's device messages name it (``explicit
    input sharding``, ``explicit output sharding``).

    A NamedSharding (bare or in a ``Format``) names its mesh; a
    SingleDeviceSharding names a one-device mesh (``leaf_mesh``).
    """
    found = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_spec_leaf)[0]
    return [
        (f"{arg_name}{keystr(path)}", mesh, kind)
        for path, leaf in found
        if (mesh := leaf_mesh(leaf)) is not None
    ]


def _one_level(x: Any, is_leaf: Callable[[Any], bool] | None) -> tuple[Any, list[tuple[Any, Any]]]:
    """``(node_data, [(key, child), ...])`` of ``x``; node_data is None for a leaf.

    An empty container is a node (``node_data`` names its type) with no children.
    """
    if is_leaf is not None and is_leaf(x):
        return None, []
    kids, treedef = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    data = treedef.node_data()  # type: ignore[attr-defined]
    if data is None:
        return None, []
    return data, [(path[0], child) for path, child in kids]


def _args_tuple_problem(prefix: Any, args: tuple[Any, ...]) -> str | None:
    """How an in-spec tree fails to stand for the arguments tuple at its top level
    (jax's words), or None: a leaf, or a tuple of the right length."""
    if is_spec_leaf(prefix):
        return None
    if type(prefix) is not tuple:
        problem = f"is not a tuple: got {type(prefix)} instead"
    elif len(prefix) != len(args):
        return (
            f"is the wrong length: got a tuple or list of length {len(prefix)} for an args "
            f"tuple of length {len(args)}"
        )
    else:
        return None
    if len(args) == 1:
        try:
            broadcast_prefix((prefix,), args, api="", what="")
        except ValueError:
            return problem
        problem += (
            ". Given the corresponding argument being passed, it looks like the spec tree might "
            "need to be wrapped in a singleton tuple"
        )
    return problem


def _jax_mismatch(
    kind: str,
    api: str,
    path: KeyPath,
    ours: Any,
    theirs: Any,
    n_ours: int = 0,
    n_theirs: int = 0,
) -> str:
    """One line of jax's "Mismatch details": how the two trees part at ``path``."""
    at = f"pytree structure error: {{}} at key path\n    {api}{keystr(path)}\nAt that key path, "
    if kind == "different types":
        return at.format(kind) + (
            f"the prefix pytree {api} has a subtree of type\n    {ours}\nbut at the same key "
            f"path the full pytree has a subtree of different type\n    {theirs}."
        )
    node = ours[0].__name__
    if kind == "different lengths":
        return at.format(f"different lengths of {node}") + (
            f"the prefix pytree {api} has a subtree of type {node} of length {n_ours}, but the "
            f"full pytree has a subtree of the same type but of length {n_theirs}."
        )
    return at.format("different pytree metadata") + (
        f"the prefix pytree {api} has a subtree of type\n    {ours[0]}\nwith metadata\n    "
        f"{ours[1]}\nbut at the same key path the full pytree has a subtree of the same type "
        f"but with metadata\n    {theirs[1]}"
    )


#: Where a spec tree and a value tree part: the key path, jax's account (empty where
#: jax has none), ours.
_Mismatch = tuple[KeyPath, str, str]


def _node_mismatch(
    p: Any,
    f: Any,
    prefix_level: tuple[Any, list[tuple[Any, Any]]],
    full_level: tuple[Any, list[tuple[Any, Any]]],
    path: KeyPath,
    api: str,
    what: str,
) -> _Mismatch | None:
    """How the spec node ``p`` fails to match the value node ``f`` at ``path``, or None."""
    (p_data, p_kids), (f_data, f_kids) = prefix_level, full_level
    if p_data is None:
        return path, "", f"{type(p).__name__} {p!r} is not a spec tree node"
    if f_data is None or p_data[0] is not f_data[0]:
        theirs = type(f).__name__ if f_data is None else f_data[0].__name__
        leaf = " leaf of type" if f_data is None else ""
        return (
            path,
            _jax_mismatch("different types", api, path, type(p), type(f)),
            f"the spec tree has a {p_data[0].__name__} where the {what} has a{leaf} {theirs}",
        )
    if p_data[1] == f_data[1] and len(p_kids) == len(f_kids):
        return None
    p_keys = [keystr((k,)) for k, _ in p_kids]
    f_keys = [keystr((k,)) for k, _ in f_kids]
    missing = sorted(set(f_keys) - set(p_keys))
    extra = sorted(set(p_keys) - set(f_keys))
    kind = "different lengths" if p_data[1] == f_data[1] else "different metadata"
    return (
        path,
        _jax_mismatch(kind, api, path, p_data, f_data, len(p_kids), len(f_kids)),
        f"the spec tree has children {p_keys} but the {what} has children {f_keys} "
        f"(length {len(p_kids)} vs {len(f_kids)}; missing from the spec tree: "
        f"{missing or 'none'}, not in the {what}: {extra or 'none'})",
    )


def _not_a_prefix(mismatches: list[_Mismatch], api: str, what: str) -> str:
    """jax's "Mismatch details" (every place the trees part), then ours and the hint."""
    details = "\n".join(theirs for _, theirs, _ in mismatches if theirs)
    ours = "\n".join(
        MSG_NOT_A_PREFIX.format(
            api=api, what=what, path=keystr(path) or "the top level", detail=detail
        ).split("\n")[0]
        for path, _, detail in mismatches
    )
    hint = MSG_NOT_A_PREFIX.split("\n", 1)[1].format(what=what)
    head = f"Mismatch details ({len(mismatches)} found):\n{details}\n" if details else ""
    return f"{head}{ours}\n{hint}"


def broadcast_prefix(
    prefix: Any, full: Any, *, api: str, what: str
) -> tuple[list[Any], list[KeyPath]]:
    """Broadcast each leaf of ``prefix`` over the subtree of ``full`` it stands for.

    Returns:
        ``(specs, paths)``: one prefix leaf and one key path per leaf of ``full``,
        in ``jax.tree_util`` flattening order.

    Raises:
        ValueError: ``prefix`` is not a pytree prefix of ``full``: jax's account of
            every place the trees part, then ours (the key path and both node kinds).
    """
    specs: list[Any] = []
    paths: list[KeyPath] = []
    mismatches: list[_Mismatch] = []

    def walk(p: Any, f: Any, path: KeyPath) -> None:
        if is_spec_leaf(p):
            for sub_path, _ in jax.tree_util.tree_flatten_with_path(f)[0]:
                specs.append(p)
                paths.append(path + sub_path)
            return
        p_data, p_kids = _one_level(p, is_spec_leaf)
        f_data, f_kids = _one_level(f, None)
        found = _node_mismatch(p, f, (p_data, p_kids), (f_data, f_kids), path, api, what)
        if found is not None:
            mismatches.append(found)
            return
        for (key, pc), (_, fc) in zip(p_kids, f_kids, strict=True):
            walk(pc, fc, path + (key,))

    if what == "positional arguments" and (problem := _args_tuple_problem(prefix, full)):
        raise ValueError(MSG_ARGS_TUPLE.format(api=api, problem=problem))
    walk(prefix, full, ())
    if mismatches:
        raise ValueError(_not_a_prefix(mismatches, api, what))
    return specs, paths
