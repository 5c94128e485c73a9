"""Memory layouts in the lowered module: ``mhlo.layout_mode`` on ``main``.

A spec's layout (a ``Format`` leaf's ``Layout``, or ``Layout.AUTO``) reaches
XLA as ``jax.jit`` sends it: an ``mhlo.layout_mode`` attribute on that argument
or result of ``main``, XLA's layout string (``"{0,1}"``) or ``"auto"`` (XLA
picks, and ``Compiled.input_formats`` reports what it picked). Values with no
stated layout get no attribute: XLA's default, as before.
"""

from __future__ import annotations

from typing import Any

from jax.experimental.layout import Layout

from .. import jax_private as jp
from ..sharding.leaves import is_default_layout, xla_layout_text
from ..sharding.parsed import ParsedPartitionSpec
from .annotate import MainValues, add_value_attrs

MSG_AUTO_DONATION = """\
{where}: a donated input with layout {got_in} would be reused by an output with layout \
{got_out}. Did you mean to set the **{side} layout** to **Layout.AUTO**? (jax.jit refuses \
this pairing too: one side's layout would be chosen by XLA, the other fixed.)"""


def _is_auto(layout: Any) -> bool:
    return layout is not None and not isinstance(layout, Layout)


def _concrete(spec: ParsedPartitionSpec | None, ndim: int) -> Any:
    """The spec's layout, XLA's default spelled as None (both mean the same buffer)."""
    layout = None if spec is None else spec.layout
    if isinstance(layout, Layout) and is_default_layout(layout, ndim):
        return None
    return layout


def same_donated_layout(
    in_spec: ParsedPartitionSpec | None, out_spec: ParsedPartitionSpec | None, ndim: int, where: str
) -> bool:
    """Whether a donated input can alias an output as far as layouts go (as jax.jit decides).

    Raises:
        ValueError: one side's layout is ``Layout.AUTO`` and the other's is not.
    """
    li, lo = _concrete(in_spec, ndim), _concrete(out_spec, ndim)
    if _is_auto(li) != _is_auto(lo):
        side = "output" if _is_auto(li) else "input"
        raise ValueError(MSG_AUTO_DONATION.format(where=where, got_in=li, got_out=lo, side=side))
    return li == lo


def has_layouts(values: MainValues) -> bool:
    """Some argument's or result's spec states a layout."""
    return any(
        s is not None and s.layout is not None for _, _, specs in values.sides() for s in specs
    )


def annotate_layouts(main: Any, values: MainValues) -> None:
    """Add ``mhlo.layout_mode`` where a spec states a layout (attributes already set)."""
    for key, avals, specs in values.sides():

        def layout_mode(i: int, avals: Any = avals, specs: Any = specs) -> dict[str, Any]:
            spec = specs[i]
            text = xla_layout_text(None if spec is None else spec.layout, avals[i])
            return {} if text is None else {"mhlo.layout_mode": jp.StringAttr.get(text)}

        add_value_attrs(main, key, len(avals), layout_mode)
