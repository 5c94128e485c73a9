"""``id_print``: the text it prints, compared with numpy's formatting (seed 003).

``id_print`` is ``id_tap`` with a printing tap function; the tap semantics it shares
(values, orders, transformations, devices) are in test_tap.py.
"""

from __future__ import annotations

import io

import jax
import numpy as np

from partitioner.host_callback import barrier_wait, id_print


def test_id_print_prints_sorted_kwargs_then_arrays(jax_partitioner_mode) -> None:
    stream = io.StringIO()
    x = {"b": np.arange(3), "a": np.float32(1.5)}
    out = jax.jit(lambda x: id_print(x, output_stream=stream, zwhat="z", awhat="a"))(x)
    jax.tree.map(np.testing.assert_array_equal, out, x)
    barrier_wait()
    assert stream.getvalue() == "awhat: a zwhat: z\n{ a=1.5\nb=[0 1 2] }\n"


def test_id_print_threshold_summarizes_large_arrays() -> None:
    stream = io.StringIO()
    id_print(np.arange(100), output_stream=stream, threshold=10)
    barrier_wait()
    assert stream.getvalue() == np.array2string(np.arange(100), threshold=10) + "\n"


def test_id_print_shows_transforms() -> None:
    stream = io.StringIO()
    jax.grad(lambda x: id_print(x * 2, output_stream=stream).sum())(np.ones(2, np.float32))
    barrier_wait()
    assert stream.getvalue().splitlines() == [
        "[2. 2.]",
        "transforms: ('jvp', 'transpose')",
        "[1. 1.]",
    ]
