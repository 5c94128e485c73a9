"""Collectives in a ``pmap`` body take negative axes, as everywhere else in jax.

``lax.psum_scatter(..., scatter_dimension=-1)`` and ``lax.all_to_all`` with a
negative ``split_axis`` / ``concat_axis`` fail to lower in jax 0.10.2, and the
untiled ``all_to_all`` gets its shapes wrong before anything reaches a lowering
rule, so a lowering rule cannot fix it: the axes are canonicalized where jax's
own later fix does, in the API (NOTE [negative collective axes] in
``jax_private``). Importing this module installs it.
"""

from __future__ import annotations

from .. import jax_private as jp

jp.canonicalize_collective_axes()
