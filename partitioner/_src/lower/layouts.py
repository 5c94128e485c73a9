"""Memory layouts in the lowered module: ``mhlo.layout_mode`` on ``main``.

A spec's layout (a ``Format`` leaf's ``Layout``, or ``Layout.AUTO``) reaches
XLA as ``jax.jit`` sends it: an ``mhlo.layout_mode`` attribute on that argument
or result of ``main``, XLA's layout string (``"{0,1}"``) or ``"auto"`` (XLA
picks, and ``Compiled.input_formats`` reports what it picked). Values with no
stated layout get no attribute: XLA's default, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import jax_private as jp
from ..spec.parsed import ParsedPartitionSpec
from ..spec.placement import xla_layout_text

ir = jp.ir


def has_layouts(*spec_lists: Sequence[ParsedPartitionSpec | None]) -> bool:
    return any(s is not None and s.layout is not None for specs in spec_lists for s in specs)


def annotate_layouts(
    main: Any,
    in_avals: Sequence[Any],
    in_specs: Sequence[ParsedPartitionSpec | None],
    out_avals: Sequence[Any],
    out_specs: Sequence[ParsedPartitionSpec | None],
) -> None:
    """Add ``mhlo.layout_mode`` where a spec states a layout (attributes already set)."""
    attrs = main.attributes

    def with_layouts(old: Any, avals: Sequence[Any], specs: Sequence[Any]) -> Any:
        n_tokens = len(ir.ArrayAttr(old)) - len(avals)
        dicts = []
        for i, d in enumerate(ir.ArrayAttr(old)):
            entries = {n.name: n.attr for n in ir.DictAttr(d)}  # type: ignore[attr-defined]
            if i >= n_tokens:
                spec = specs[i - n_tokens]
                text = xla_layout_text(None if spec is None else spec.layout, avals[i - n_tokens])
                if text is not None:
                    entries["mhlo.layout_mode"] = ir.StringAttr.get(text)
            dicts.append(ir.DictAttr.get(entries))
        return ir.ArrayAttr.get(dicts)

    attrs["arg_attrs"] = with_layouts(attrs["arg_attrs"], in_avals, in_specs)
    attrs["res_attrs"] = with_layouts(attrs["res_attrs"], out_avals, out_specs)
