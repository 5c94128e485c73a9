"""One checked spec per output leaf of a call, after tracing.

A given spec is checked against the traced output (axes, rank, divisibility,
layout); an omitted one is ``None`` (XLA's propagation decides); ``AUTO`` waits
for the AUTO stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh
from jax.tree_util import KeyPath, keystr

from .. import jax_private as jp
from .checks import check_specs, given_specs
from .leaves import check_layouts
from .parsed import REPLICATED
from .tree import UNSPECIFIED, broadcast_prefix


def output_specs(
    prefix: Any, outs: Any, out_avals: Sequence[Any], mesh: Mesh, *, api: str, out_name: str
) -> tuple[tuple[Any, ...], list[KeyPath]]:
    """One spec per output leaf (omitted: None, XLA propagates; AUTO stays) and its key path.

    Args:
        outs: the output tree (of avals), as the body returned it.

    Raises:
        ValueError: the tree is not a prefix of the outputs; a bad spec or layout.
    """
    specs, paths = broadcast_prefix(prefix, outs, api=f"{api} {out_name}", what="outputs")
    # An ordering token holds no data: replicated, whatever the tree says (as jax's).
    specs = [REPLICATED if jp.is_token(a) else s for s, a in zip(specs, out_avals, strict=True)]
    given = given_specs(specs, out_avals)
    check_specs(
        f"{api} outputs",
        [specs[i] for i in given],
        [f"{api} output{keystr(paths[i])}" for i in given],
        [f"pjit outputs with pytree key path {keystr(paths[i])}" for i in given],
        [out_avals[i].shape for i in given],
        mesh,
    )
    check_layouts(
        api,
        [specs[i] for i in given],
        [out_avals[i] for i in given],
        lambda k: f"{api} output{keystr(paths[given[k]])}",
    )
    return tuple(None if s is UNSPECIFIED else s for s in specs), paths
