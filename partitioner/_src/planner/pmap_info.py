"""``pmap`` options, parsed and checked once when a function is wrapped.

Why a record: the map's axis, its in/out axes, its statics and donation, and
where it may run are fixed when the function is wrapped; every call reads them
(``pmap_plan.py``), and none of that is a call's business to change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from ..distributed.local_map import is_multiprocess
from ..trace.argnums import check_callable, index_tuple
from ..trace.arguments import Binding


@dataclass(frozen=True)
class PmapInfo:
    """A pmap-ed function's options.

    Attributes:
        fun / name: the user's function and its name.
        axis_name: the mapped axis (an unnamed map is named after its function,
            as classic jax.pmap's was: a fresh pmap of the same function then
            reuses its trace, NOTE [derived jaxpr cache]).
        in_axes / out_axes: pytree prefixes of the arguments / outputs (int or None).
        out_axes_key: ``out_axes`` as a hashable trace-cache key part.
        binding: statics (``static_broadcasted_argnums``) and donation, by position.
        devices / backend / axis_size: where the map may run, and its size when
            no argument is mapped.
        multiprocess: made in one process of a multi-process job (NOTE
            [multi-process pmap]): calls take this process's slices.
    """

    fun: Callable[..., Any]
    name: str
    axis_name: str
    in_axes: Any
    out_axes: Any
    out_axes_key: Any
    binding: Binding
    devices: tuple[jax.Device, ...] | None
    backend: str | None
    axis_size: int | None
    multiprocess: bool

    @property
    def label(self) -> str:
        """``"pmap f"``: how messages start."""
        return self.binding.api


def pmap_info(
    fun: Callable[..., Any],
    axis_name: str | None,
    in_axes: Any,
    out_axes: Any,
    static_broadcasted_argnums: int | Sequence[int],
    devices: Sequence[jax.Device] | None,
    backend: str | None,
    axis_size: int | None,
    donate_argnums: int | Sequence[int],
) -> PmapInfo:
    """Check ``pmap``'s options as jax.pmap does.

    Raises:
        TypeError: ``fun`` is not callable; a bad axis name, in/out axes leaf or argnums.
        ValueError: bad devices or axis size; an argument both static and donated.
    """
    check_callable(fun, "pmap")
    name = getattr(fun, "__name__", type(fun).__name__)
    label = f"pmap {name}"
    if axis_name is not None and not isinstance(axis_name, str):
        raise TypeError(f"{label}: axis_name must be a str or None, got {axis_name!r}")
    in_axes = tuple(in_axes) if isinstance(in_axes, list) else in_axes
    _check_axes_types(in_axes, "in_axes", label)
    _check_axes_types(out_axes, "out_axes", label)
    statics = index_tuple(
        static_broadcasted_argnums, "static_broadcasted_argnums", label, negative=False
    )
    donate = index_tuple(donate_argnums, "donate_argnums", label, negative=False)
    if set(statics) & set(donate):
        raise ValueError(
            f"{label}: arguments {sorted(set(statics) & set(donate))} are both static and donated"
        )
    leaves, tree = jax.tree_util.tree_flatten(out_axes, is_leaf=lambda x: x is None)
    return PmapInfo(
        fun=fun,
        name=name,
        axis_name=axis_name or f"_pmap_{id(fun):x}",
        in_axes=in_axes,
        out_axes=out_axes,
        out_axes_key=(tree, tuple(map(repr, leaves))),
        binding=Binding(
            label,
            static_argnums=statics,
            donate_argnums=donate,
            static_hint="static_broadcasted_argnums",
        ),
        devices=_checked_devices(devices, label),
        backend=backend,
        axis_size=_checked_axis_size(axis_size, label),
        multiprocess=is_multiprocess(),
    )


def _check_axes_types(axes: Any, what: str, label: str) -> None:
    """As jax.pmap: every leaf of ``axes`` is exactly an ``int`` (a bool is not) or None.

    Raises:
        TypeError: a leaf of another type (``in_axes=False``, a float, a string...).
    """
    bad = [leaf for leaf in jax.tree_util.tree_leaves(axes) if type(leaf) is not int]
    if bad:
        raise TypeError(
            f"{label}: {what} must be an int, None, or a (nested) container with those "
            f"types as leaves, but got {axes!r} (leaf {bad[0]!r} of type "
            f"{type(bad[0]).__name__}); write 0 to map the leading dimension, None to broadcast"
        )


def _checked_devices(
    devices: Sequence[jax.Device] | None, label: str
) -> tuple[jax.Device, ...] | None:
    if devices is None:
        return None
    devices = tuple(devices)
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise ValueError(
            f"{label}: devices must be a non-empty sequence of jax.Device, got {devices!r}"
        )
    return devices


def _checked_axis_size(axis_size: int | None, label: str) -> int | None:
    if axis_size is not None and (not isinstance(axis_size, int) or axis_size < 1):
        raise ValueError(f"{label}: axis_size must be a positive int, got {axis_size!r}")
    return axis_size
