"""The gateway to private jax (``partitioner/_src/jax_private``): the releases it accepts,
and its two process-wide patches, each failing loudly when what it wraps is gone and a
no-op when installed twice. (That nothing outside the gateway reads ``jax._src`` is
``tests/test_architecture.py``'s.)"""

from __future__ import annotations

import jax._src.dispatch
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lax import parallel

from partitioner._src import jax_private


@pytest.mark.parametrize("version", ["0.9.2", "0.11.0", "1.0.0", "nightly"])
def test_gateway_refuses_an_unsupported_jax(version: str) -> None:
    with pytest.raises(ImportError, match=rf"supports jax 0\.10\.x .* found jax {version}"):
        jax_private.check_jax_version(version)


def test_gateway_accepts_jax_0_10_and_finds_the_hook_it_patches() -> None:
    for version in ("0.10.0", "0.10.2", "0.10.9.dev20260101"):
        jax_private.check_jax_version(version)
    jax_private.check_intermediate_shardings_hook()
    # installed once, process-wide, at import (NOTE [device assignment under jax.jit])
    assert getattr(jax._src.dispatch.get_intermediate_shardings, "_partitioner_find", None)


def test_a_jax_without_the_hook_is_refused_with_what_to_install(monkeypatch) -> None:
    monkeypatch.delattr(jax._src.dispatch, "get_intermediate_shardings")
    with pytest.raises(ImportError, match=r"get_intermediate_shardings.*install a supported jax"):
        jax_private.check_intermediate_shardings_hook()


def test_the_patches_installed_twice_wrap_once() -> None:
    hook = jax._src.dispatch.get_intermediate_shardings
    scatter, to_all = parallel._psum_scatter_is_async, parallel._all_to_all_is_async
    jax_private.report_intermediate_shardings(lambda jaxpr: iter(()))
    jax_private.canonicalize_collective_axes()
    assert jax._src.dispatch.get_intermediate_shardings is hook
    assert (parallel._psum_scatter_is_async, parallel._all_to_all_is_async) == (scatter, to_all)


def test_a_jax_without_the_collectives_it_wraps_is_refused(monkeypatch) -> None:
    monkeypatch.delattr(parallel, "_all_to_all_is_async")
    with pytest.raises(ImportError, match=r"_all_to_all_is_async.*install a supported jax"):
        jax_private.canonicalize_collective_axes()


def test_negative_collective_axes_count_from_the_end() -> None:
    """NOTE [negative collective axes]: the backport's effect, against the positive axis."""
    x = jnp.arange(2 * 4 * 6, dtype=jnp.float32).reshape(2, 4, 6)

    def scattered(axis: int):
        return jax.vmap(lambda v: parallel.psum_scatter(v, "i", scatter_dimension=axis, tiled=True),
                        axis_name="i")(x)  # fmt: skip

    np.testing.assert_array_equal(scattered(-1), scattered(1))
