"""Property: random in_axes / out_axes over random pytrees agree with jax.pmap.

Each example draws 1-3 arguments (an array, a tuple or a dict of arrays), an
``in_axes`` prefix for them (an int anywhere in each leaf's rank, or None, per
argument or per leaf), and an ``out_axes`` per output leaf; the body returns one
output per input leaf, replicated (``psum``) where its ``out_axes`` is None.
Values and shard placement must equal jax.pmap's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partitioner import pmap
from tests.pmap.test_pmap import assert_same

N = 4  # devices: small programs, quick compiles

# among the slowest modules measured (--durations); every map is over N devices
pytestmark = [pytest.mark.slow, pytest.mark.needs_devices(N)]


@st.composite
def leaf(draw: st.DrawFn) -> tuple[np.ndarray, int | None, int | None]:
    """An array with an N-long dimension somewhere, and its in_axis (that dim, or None):
    as jax.pmap gets it (non-negative: jax.pmap 0.10.2 mishandles negative axes) and
    as ours gets it (sometimes counted from the end)."""
    rank = draw(st.integers(1, 3))
    mapped = draw(st.one_of(st.none(), st.integers(0, rank - 1)))
    shape = [draw(st.integers(1, 3)) for _ in range(rank)]
    ours = mapped
    if mapped is not None:
        shape[mapped] = N
        if draw(st.booleans()):
            ours = mapped - rank
    seed = draw(st.integers(0, 2**16))
    value = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return value, mapped, ours


@st.composite
def argument(draw: st.DrawFn) -> tuple[Any, Any, Any, bool]:
    """(value, jax's in_axes prefix, ours, whether a leaf is mapped): a leaf, or a
    container whose prefix is one axis or one per leaf."""
    kind = draw(st.sampled_from(["leaf", "tuple", "dict"]))
    if kind == "leaf":
        value, axis, ours = draw(leaf())
        return value, axis, ours, axis is not None
    leaves = draw(st.lists(leaf(), min_size=1, max_size=3))
    values = [v for v, _, _ in leaves]
    axes = [a for _, a, _ in leaves]
    mine = [o for _, _, o in leaves]
    mapped = any(a is not None for a in axes)
    shared = (
        all(a == axes[0] for a in axes) and all(o == mine[0] for o in mine) and draw(st.booleans())
    )
    if kind == "tuple":
        if shared:
            return tuple(values), axes[0], mine[0], mapped
        return tuple(values), tuple(axes), tuple(mine), mapped
    keys = [f"k{i}" for i in range(len(values))]
    if shared:
        return dict(zip(keys, values)), axes[0], mine[0], mapped
    return dict(zip(keys, values)), dict(zip(keys, axes)), dict(zip(keys, mine)), mapped


@st.composite
def case(draw: st.DrawFn) -> tuple[tuple[Any, ...], Any, Any, list[int | None]]:
    args = draw(st.lists(argument(), min_size=1, max_size=3))
    values = tuple(a[0] for a in args)
    theirs, ours = tuple(a[1] for a in args), tuple(a[2] for a in args)
    if not any(a[3] for a in args):
        values = (np.ones((N,), np.float32), *values)  # jax.pmap needs a mapped argument
        theirs, ours = (0, *theirs), (0, *ours)
    out_axes = []
    for x in jax.tree.leaves(values):
        rank = np.ndim(x)  # the per-device output has the input's rank (minus its mapped dim)
        out_axes.append(draw(st.one_of(st.none(), st.integers(0, max(rank - 1, 0)))))
    return values, theirs, ours, out_axes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case())
def test_random_in_and_out_axes_agree_with_jax_pmap(drawn: Any) -> None:
    values, in_axes, our_in_axes, out_axes = drawn

    def body(*args: Any) -> list[Any]:
        outs = []
        for x, ax in zip(jax.tree.leaves(args), out_axes, strict=True):
            y = jnp.tanh(x) + jax.lax.psum(jnp.sum(x), "i")
            if ax is None:
                y = jax.lax.psum(y, "i")  # the same on every device, as out_axes=None needs
            else:
                y = y * (1 + jax.lax.axis_index("i"))
            outs.append(y)
        return outs

    ours = pmap(body, "i", in_axes=our_in_axes, out_axes=out_axes, devices=jax.devices()[:N])(
        *values
    )
    theirs = jax.pmap(body, "i", in_axes=in_axes, out_axes=out_axes, devices=jax.devices()[:N])(
        *values
    )
    assert_same(ours, theirs, atol=1e-4)
