"""Every row of API.md's error table: the exception type and the required fragment.

Errors may come when ``pjit`` is applied or when the function is called, so each
check wraps both. Bad input is rejected before anything is compiled.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioner
from partitioner import UNCONSTRAINED, pjit, with_sharding_constraint
from partitioner import PartitionSpec as P
from partitioner.testing.plugin import MeshFactory
from tests.helpers import MESH_2D, MESH_3D, arange, devices, mesh_ctx

Pair = namedtuple("Pair", ["left", "right"])


@contextmanager
def fails(exc: type[Exception] | tuple[type[Exception], ...], *fragments: str) -> Iterator[Any]:
    """Expect ``exc`` whose message contains every fragment; nothing may be compiled first."""
    with partitioner.recording() as events, pytest.raises(exc) as info:
        yield info
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert events["compile"] == 0, "an error must come before compiling"


def _call(f: Callable[..., Any], in_specs: Any, out_specs: Any, *args: Any, **kw: Any) -> Any:
    """Apply pjit and call: an error may come from either."""
    return jax.block_until_ready(pjit(f, in_specs, out_specs, **kw)(*args))


def _ident(x: Any) -> Any:
    return x


X84 = np.zeros((8, 4), np.float32)


# --- no mesh ---


def test_no_mesh_at_call() -> None:
    g = pjit(_ident, P("a"), P("a"))
    with fails(RuntimeError, "mesh"):
        g(X84)


def test_no_mesh_at_lower() -> None:
    g = pjit(_ident, P("a"), P("a"))
    with fails(RuntimeError, "mesh"):
        g.lower(jax.ShapeDtypeStruct((8, 4), jnp.float32))


def test_no_mesh_error_leaves_a_clean_context() -> None:
    g = pjit(_ident, P(), P())  # (None specs with no mesh run on one device, as in jax)
    with fails(RuntimeError, "mesh"):
        g(X84)
    with mesh_ctx(*MESH_2D):  # and it works once a mesh is there
        assert jax.block_until_ready(g(X84)).shape == (8, 4)


@pytest.mark.parametrize("where", ["eager", "jit"])
def test_constraint_without_mesh(where: str) -> None:
    def f(x: Any) -> Any:
        return with_sharding_constraint(x, P("a"))

    with fails((RuntimeError, ValueError)) as info:
        f(X84) if where == "eager" else jax.jit(f)(X84)
    assert "mesh" in str(info.value)


# --- a mesh axis that does not exist ---


def _call_with_spec(where: str, spec: Any) -> None:
    """Use ``spec`` as the in spec, the out spec, or a constraint on an (8, 4) value."""
    if where == "in":
        _call(_ident, spec, None, X84)
    elif where == "out":
        _call(_ident, None, spec, X84)
    else:
        _call(lambda x: with_sharding_constraint(x, spec), None, None, X84)


@pytest.mark.parametrize("where", ["in", "out", "constraint"])
def test_undefined_mesh_axis(where: str) -> None:
    bad = P("a", "zz")
    with mesh_ctx(*MESH_2D), fails(ValueError, "zz"):
        _call_with_spec(where, bad)


def test_undefined_mesh_axis_eager_constraint() -> None:
    with mesh_ctx(*MESH_2D), fails(ValueError, "zz"):
        with_sharding_constraint(X84, P("zz"))


# --- divisibility ---


@pytest.mark.parametrize(
    ("mesh_def", "spec", "shape", "size", "divisor"),
    [
        pytest.param(MESH_2D, P("a"), (6, 4), 6, 4, id="one-axis"),
        pytest.param(MESH_2D, P(None, ("a", "b")), (4, 12), 12, 8, id="tuple-axes"),
        pytest.param(MESH_3D, P(None, None, "c"), (2, 2, 3), 3, 2, id="3d-last-dim"),
    ],
)
@pytest.mark.parametrize("where", ["in", "out"])
def test_not_divisible(where: str, mesh_def, spec, shape, size: int, divisor: int) -> None:
    x = np.zeros(shape, np.float32)
    with mesh_ctx(*mesh_def), fails(ValueError) as info:
        if where == "in":
            _call(_ident, spec, None, x)
        else:
            _call(_ident, None, spec, x)
    message = str(info.value)
    assert re.search(rf"\b{size}\b", message), message
    assert re.search(rf"\b{divisor}\b", message), message


def test_constraint_has_no_divisibility_check() -> None:
    x = np.zeros((6, 3), np.float32)
    with mesh_ctx(*MESH_2D):
        out = _call(lambda v: with_sharding_constraint(v, P("a", "b")), None, None, x)
    assert out.shape == (6, 3)


# --- spec longer than the rank ---


@pytest.mark.parametrize("where", ["in", "out", "constraint"])
def test_spec_longer_than_rank(where: str) -> None:
    bad = P("a", None, "b")
    with mesh_ctx(*MESH_2D), fails(ValueError) as info:
        _call_with_spec(where, bad)
    assert re.search("rank|ndim", str(info.value)), str(info.value)


def test_spec_longer_than_rank_of_a_scalar() -> None:
    with mesh_ctx(*MESH_2D), fails(ValueError) as info:
        _call(_ident, P("a"), None, 3.0)
    assert re.search("rank|ndim", str(info.value))


# --- an axis used twice ---


@pytest.mark.parametrize(
    ("bad", "axis"),
    [(P("a", "a"), "a"), (P(("b", "a"), "b"), "b"), (P(("a", "a")), "a")],
    ids=["two-dims", "tuple-and-dim", "in-tuple"],
)
@pytest.mark.parametrize("where", ["in", "out", "constraint"])
def test_duplicate_mesh_axis(where: str, bad: P, axis: str) -> None:
    with mesh_ctx(*MESH_2D), fails(ValueError, repr(axis)):
        _call_with_spec(where, bad)


# --- a spec leaf that is not a spec ---


@pytest.mark.parametrize(
    "bad", ["a", 3, ("a", None), 1.5], ids=["str", "int", "tuple-of-str", "float"]
)
@pytest.mark.parametrize("where", ["in", "out", "constraint"])
def test_spec_leaf_not_a_spec(where: str, bad: Any) -> None:
    with mesh_ctx(*MESH_2D), fails(TypeError):
        if where == "in":
            _call(_ident, (bad,) if isinstance(bad, tuple) else bad, None, X84)
        elif where == "out":
            _call(_ident, None, bad, X84)
        else:
            _call(lambda x: with_sharding_constraint(x, bad), None, None, X84)


def test_spec_leaf_not_a_spec_nested() -> None:
    with mesh_ctx(*MESH_2D), fails(TypeError):
        _call(lambda d: d["w"], ({"w": "a"},), None, {"w": X84})


# --- UNCONSTRAINED in pjit specs ---


@pytest.mark.parametrize("where", ["in", "out"])
def test_unconstrained_in_pjit_spec(where: str) -> None:
    bad = P("a", UNCONSTRAINED)
    with mesh_ctx(*MESH_2D), fails(ValueError):
        if where == "in":
            _call(_ident, bad, None, X84)
        else:
            _call(_ident, None, bad, X84)


def test_jax_unconstrained_in_pjit_spec() -> None:
    bad = jax.sharding.PartitionSpec(jax.sharding.PartitionSpec.UNCONSTRAINED)
    with mesh_ctx(*MESH_2D), fails(ValueError):
        _call(_ident, bad, None, X84)


# --- in_axis_resources structure ---


@pytest.mark.parametrize(
    "specs", [(P("a"),), (P("a"), None, None), [P("a")]], ids=["short", "long", "short-list"]
)
def test_in_axis_resources_wrong_length(specs: Any) -> None:
    def f(x: Any, y: Any) -> Any:
        return x + y

    with mesh_ctx(*MESH_2D), fails(ValueError) as info:
        _call(f, specs, None, X84, X84)
    assert re.search("in_axis_resources|prefix|length", str(info.value))


def test_namedtuple_in_axis_resources_for_argument_tuple() -> None:
    def f(x: Any, y: Any) -> Any:
        return x + y

    with mesh_ctx(*MESH_2D), fails(ValueError) as info:
        _call(f, Pair(P("a"), None), None, X84, X84)
    assert re.search("in_axis_resources|prefix|tuple", str(info.value))


@pytest.mark.parametrize(
    ("out_specs", "out_fn"),
    [
        pytest.param((P("a"), None, None), lambda x: (x, x), id="tuple-too-long"),
        pytest.param((P("a"),), lambda x: x, id="tuple-for-leaf"),
        pytest.param({"y": P("a")}, lambda x: {"z": x}, id="dict-keys"),
        pytest.param({"k": (P("a"), None)}, lambda x: {"k": [x, x]}, id="nested-tuple-for-list"),
        pytest.param((None, {"w": None}), lambda x: (x, [x]), id="dict-for-list"),
    ],
)
def test_out_axis_resources_not_a_prefix(out_specs: Any, out_fn: Callable[..., Any]) -> None:
    with mesh_ctx(*MESH_2D), fails(ValueError):
        _call(out_fn, P("a"), out_specs, X84)


@pytest.mark.parametrize("kw", ["static_argnums", "donate_argnums"])
@pytest.mark.parametrize("index", [2, 5, (0, 2)])
def test_argnums_out_of_range(kw: str, index: Any) -> None:
    def f(x: Any, y: Any) -> Any:
        return x + y

    with mesh_ctx(*MESH_2D), fails(ValueError):
        _call(f, None, None, X84, X84, **{kw: index})


# --- a mesh changed inside a pjit-ed function ---


def test_different_mesh_inside_pjit() -> None:
    inner = pjit(_ident, None, None)

    def outer(x: Any) -> Any:
        with partitioner.mesh(devices(2, 2), ("a", "b")):
            return inner(x)

    with mesh_ctx(*MESH_2D), fails((RuntimeError, ValueError)) as info:
        _call(outer, None, None, X84)
    assert "mesh" in str(info.value)


@pytest.mark.filterwarnings("ignore:.*context manager has been deprecated:DeprecationWarning")
def test_different_jax_mesh_inside_pjit_constraint(mesh: MeshFactory) -> None:
    def outer(x: Any) -> Any:
        with mesh((8,), ("a",)):
            return with_sharding_constraint(x, P("a"))

    with mesh_ctx(*MESH_2D), fails((RuntimeError, ValueError)) as info:
        _call(outer, None, None, X84)
    assert "mesh" in str(info.value)


def test_same_mesh_reentered_inside_pjit_is_fine() -> None:
    inner = pjit(lambda x: x * 2, P("a"), P("a"))

    def outer(x: Any) -> Any:
        with partitioner.mesh(devices(4, 2), ("a", "b")):
            return inner(x) + 1

    with mesh_ctx(*MESH_2D):
        out = _call(outer, None, None, arange(8, 4))
    np.testing.assert_allclose(np.asarray(out), arange(8, 4) * 2 + 1)


# --- calling a Compiled with other arguments ---


@pytest.mark.parametrize(
    ("value", "dtype_name"),
    [
        (np.zeros((8, 4), np.int32), "int32"),
        (np.zeros((8, 4), np.float16), "float16"),
        (jnp.zeros((8, 4), jnp.bfloat16), "bfloat16"),
    ],
)
def test_compiled_with_other_dtype(value: Any, dtype_name: str) -> None:
    with mesh_ctx(*MESH_2D):
        compiled = pjit(_ident, P("a"), P("a")).lower(X84).compile()
        with pytest.raises(TypeError, match=dtype_name):
            compiled(value)


def test_compiled_with_other_shape() -> None:
    with mesh_ctx(*MESH_2D):
        compiled = pjit(_ident, P("a"), P("a")).lower(X84).compile()
        # jax's own sentence, naming both shapes
        with pytest.raises(
            TypeError,
            match=r"(?s)Argument types differ.*compiled with float32\[8,4\].*float32\[4,8\]",
        ):
            compiled(np.zeros((4, 8), np.float32))


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(({"w": X84},), id="dict-for-array"),
        pytest.param((X84, X84), id="extra-argument"),
        pytest.param((), id="missing-argument"),
        pytest.param(([X84],), id="list-for-array"),
    ],
)
def test_compiled_with_other_pytree(args: tuple[Any, ...]) -> None:
    with mesh_ctx(*MESH_2D):
        compiled = pjit(_ident, P("a"), P("a")).lower(X84).compile()
        with pytest.raises(TypeError):
            compiled(*args)


def test_compiled_with_other_nested_pytree() -> None:
    def f(d: dict) -> Any:
        return d["w"] + d["b"]

    with mesh_ctx(*MESH_2D):
        compiled = pjit(f, P("a"), P("a")).lower({"w": X84, "b": X84}).compile()
        with pytest.raises(TypeError):
            compiled({"w": X84, "c": X84})


# --- messages name the argument's key path ---


def test_error_names_nested_dict_key_path() -> None:
    def f(params: dict, x: Any) -> Any:
        return params["layer"]["w"] @ x

    params = {"layer": {"w": np.zeros((6, 8), np.float32)}}
    with mesh_ctx(*MESH_2D), fails(ValueError, "['w']", "['layer']") as info:
        _call(f, ({"layer": {"w": P("a")}}, None), None, params, np.zeros((8,), np.float32))
    assert "6" in str(info.value)


def test_error_names_positional_index_and_list_index() -> None:
    def f(x: Any, xs: list) -> Any:
        return x + xs[1]

    with mesh_ctx(*MESH_2D), fails(ValueError, "[1]") as info:
        _call(f, (None, P(None, "zz")), None, X84, [X84, X84])
    assert "zz" in str(info.value)


def test_error_names_output_key_path() -> None:
    def f(x: Any) -> Any:
        return {"logits": x, "aux": x.sum()}

    with mesh_ctx(*MESH_2D), fails(ValueError, "['aux']") as info:
        _call(f, None, {"logits": P("a"), "aux": P("a")}, X84)
    assert re.search("rank|ndim", str(info.value))


def test_error_names_the_function() -> None:
    def my_special_fn(x: Any) -> Any:
        return x

    with mesh_ctx(*MESH_2D), fails(ValueError, "my_special_fn"):
        _call(my_special_fn, P("zz"), None, X84)


def test_non_array_argument_is_a_type_error() -> None:
    with mesh_ctx(*MESH_2D), fails(TypeError):
        _call(_ident, None, None, "not an array")


def test_unhashable_static_argument() -> None:
    def f(x: Any, cfg: Any) -> Any:
        return x * len(cfg)

    with mesh_ctx(*MESH_2D), fails((TypeError, ValueError)):
        _call(f, None, None, X84, [1, 2], static_argnums=1)
