"""``f.lower(...).as_text()``: StableHLO annotated by partitioner for GSPMD or Shardy.

GSPMD annotations are compared with what jax's own ``NamedSharding`` would
produce (``_to_xla_hlo_sharding``); Shardy ones with the expected attribute text.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import xla_client as xc

import partitioner
from partitioner import UNCONSTRAINED, pjit, with_sharding_constraint
from partitioner import PartitionSpec as P
from tests.helpers import MESH_2D, MESH_3D, mesh_ctx, named

MODES = ["gspmd", "shardy"]


def _main_signature(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if "func.func public @main(" in ln]
    return line


def gspmd_main_shardings(text: str) -> list[str]:
    """The ``mhlo.sharding`` strings of main's arguments then results, in order."""
    return re.findall(r'mhlo\.sharding = "([^"]*)"', _main_signature(text))


def shardy_main_shardings(text: str) -> list[str]:
    """The dimension lists of main's ``sdy.sharding`` attributes, e.g. ``[{"a"}, {}]``."""
    return re.findall(r"sdy\.sharding = #sdy\.sharding<@mesh, (\[[^\]]*\])>", _main_signature(text))


def _lower(f: Any, in_specs: Any, out_specs: Any, *args: Any, mode: str, mesh_def: Any) -> Any:
    with partitioner.spmd_partitioner(mode), mesh_ctx(*mesh_def) as mesh:
        return pjit(f, in_specs, out_specs).lower(*args), mesh


# (mesh, spec, shape, shardy dims)
SPEC_CASES = [
    pytest.param(MESH_2D, P("a", "b"), (8, 8), '[{"a"}, {"b"}]', id="2d-both"),
    pytest.param(MESH_2D, P("a"), (8, 8), '[{"a"}, {}]', id="2d-rows"),
    pytest.param(MESH_2D, P(None, "b"), (8, 8), '[{}, {"b"}]', id="2d-cols"),
    pytest.param(MESH_2D, P("b", "a"), (8, 8), '[{"b"}, {"a"}]', id="2d-transposed"),
    pytest.param(MESH_2D, P(("a", "b")), (8, 4), '[{"a", "b"}, {}]', id="2d-tuple"),
    pytest.param(MESH_2D, P(("b", "a")), (8, 4), '[{"b", "a"}, {}]', id="2d-tuple-reversed"),
    pytest.param(MESH_2D, None, (8, 4), "[{}, {}]", id="replicated"),
    pytest.param(MESH_2D, P(), (8,), "[{}]", id="empty-spec"),
    pytest.param(MESH_3D, P("c", ("a", "b")), (4, 4), '[{"c"}, {"a", "b"}]', id="3d"),
    pytest.param(MESH_3D, P(None, "b", None), (2, 4, 2), '[{}, {"b"}, {}]', id="3d-middle"),
]


@pytest.mark.parametrize(("mesh_def", "spec", "shape", "sdy_dims"), SPEC_CASES)
def test_gspmd_argument_and_result_annotations(mesh_def, spec, shape, sdy_dims) -> None:
    x = np.zeros(shape, np.float32)
    lowered, mesh = _lower(jnp.sin, spec, spec, x, mode="gspmd", mesh_def=mesh_def)
    text = lowered.as_text()
    assert "mhlo.sharding" in text and "sdy.sharding" not in text
    arg, res = gspmd_main_shardings(text)
    want = named(mesh, spec)._to_xla_hlo_sharding(len(shape))
    for got in (arg, res):
        assert xc.HloSharding.from_string(got) == want, (got, str(want))
        if spec is None or not spec.partitions or all(e is None for e in spec):
            assert got == "{replicated}"
        else:
            assert got.startswith("{devices=[")


@pytest.mark.parametrize(("mesh_def", "spec", "shape", "sdy_dims"), SPEC_CASES)
def test_shardy_argument_and_result_annotations(mesh_def, spec, shape, sdy_dims) -> None:
    x = np.zeros(shape, np.float32)
    lowered, mesh = _lower(jnp.sin, spec, spec, x, mode="shardy", mesh_def=mesh_def)
    text = lowered.as_text()
    assert "mhlo.sharding" not in text
    axes = ", ".join(f'"{n}"={s}' for n, s in mesh.shape.items())
    assert f"sdy.mesh @mesh = <[{axes}]>" in text
    assert shardy_main_shardings(text) == [sdy_dims, sdy_dims]
    assert f"sdy.sharding = #sdy.sharding<@mesh, {sdy_dims}>" in text


def test_mixed_specs_in_argument_order() -> None:
    def f(x: Any, y: Any, s: Any) -> Any:
        return x @ y * s, y.T

    args = (np.zeros((8, 4), np.float32), np.zeros((4, 8), np.float32), np.float32(1))
    specs_in, specs_out = (P("a"), P(None, "b"), None), (P("a", "b"), P("b"))
    lowered, mesh = _lower(f, specs_in, specs_out, *args, mode="gspmd", mesh_def=MESH_2D)
    got = [xc.HloSharding.from_string(s) for s in gspmd_main_shardings(lowered.as_text())]
    ranks = (2, 2, 0, 2, 2)
    want = [named(mesh, s)._to_xla_hlo_sharding(r) for s, r in zip((*specs_in, *specs_out), ranks)]
    assert got == want
    lowered, _ = _lower(f, specs_in, specs_out, *args, mode="shardy", mesh_def=MESH_2D)
    assert shardy_main_shardings(lowered.as_text()) == [
        '[{"a"}, {}]',
        '[{}, {"b"}]',
        "[]",
        '[{"a"}, {"b"}]',
        '[{"b"}, {}]',
    ]


@pytest.mark.parametrize("mode", MODES)
def test_pytree_arguments_flatten_in_tree_order(mode: str) -> None:
    def f(d: dict) -> Any:
        return d["w"] + d["b"]

    d = {"w": np.zeros((8, 8), np.float32), "b": np.zeros((8, 8), np.float32)}
    lowered, mesh = _lower(
        f, ({"b": None, "w": P("b", "a")},), P("a"), d, mode=mode, mesh_def=MESH_2D
    )
    text = lowered.as_text()
    # Leaves are flattened in sorted key order: "b" then "w".
    if mode == "gspmd":
        got = [xc.HloSharding.from_string(s) for s in gspmd_main_shardings(text)]
        want = [named(mesh, s)._to_xla_hlo_sharding(2) for s in (None, P("b", "a"), P("a"))]
        assert got == want
    else:
        assert shardy_main_shardings(text) == ["[{}, {}]", '[{"b"}, {"a"}]', '[{"a"}, {}]']


@pytest.mark.parametrize("mode", MODES)
def test_constraint_annotation(mode: str) -> None:
    def f(x: Any) -> Any:
        return with_sharding_constraint(jnp.cos(x), P("b", "a")) * 2

    lowered, mesh = _lower(
        f, P("a"), P("a"), np.zeros((8, 8), np.float32), mode=mode, mesh_def=MESH_2D
    )
    text = lowered.as_text()
    if mode == "gspmd":
        (line,) = [ln for ln in text.splitlines() if "custom_call @Sharding" in ln]
        (got,) = re.findall(r'mhlo\.sharding = "([^"]*)"', line)
        assert xc.HloSharding.from_string(got) == named(mesh, P("b", "a"))._to_xla_hlo_sharding(2)
        assert "unspecified_dims" not in line
    else:
        assert re.search(r'sdy\.sharding_constraint %\S+ <@mesh, \[\{"b"\}, \{"a"\}\]>', text), text


@pytest.mark.parametrize("mode", MODES)
def test_unconstrained_constraint_annotation(mode: str) -> None:
    def f(x: Any) -> Any:
        y = with_sharding_constraint(x * 3, P(UNCONSTRAINED, "b", UNCONSTRAINED))
        return y + 1

    x = np.zeros((8, 4, 2), np.float32)
    lowered, _ = _lower(f, P("a"), P("a"), x, mode=mode, mesh_def=MESH_2D)
    text = lowered.as_text()
    if mode == "gspmd":
        (line,) = [ln for ln in text.splitlines() if "custom_call @Sharding" in ln]
        assert "unspecified_dims=[0,2]" in line
    else:
        assert '<@mesh, [{?}, {"b"}, {?}]>' in text


@pytest.mark.parametrize("mode", MODES)
def test_nested_pjit_becomes_a_call_with_constraints(mode: str) -> None:
    def inner_fn(x: Any) -> Any:
        return x + 1

    inner = pjit(inner_fn, P("b"), P(None, "a"))

    def outer(x: Any) -> Any:
        return inner(x) * 2

    lowered, _ = _lower(
        outer, P("a"), P("a"), np.zeros((8, 8), np.float32), mode=mode, mesh_def=MESH_2D
    )
    text = lowered.as_text()
    assert re.search(r"func\.func private @\"?pjit_inner_fn", text), text
    assert re.search(r"call @\"?pjit_inner_fn", text)
    if mode == "gspmd":
        assert text.count("custom_call @Sharding") == 2
    else:
        assert '<@mesh, [{"b"}, {}]>' in text  # constraint on the inner input
        assert '<@mesh, [{}, {"a"}]>' in text  # and on its output
        assert text.count("sdy.sharding_constraint") == 2


@pytest.mark.parametrize("mode", MODES)
def test_usable_donation_is_an_alias(mode: str) -> None:
    def f(x: Any, y: Any) -> Any:
        return x + y

    x = np.zeros((8, 8), np.float32)
    with partitioner.spmd_partitioner(mode), mesh_ctx(*MESH_2D):
        text = pjit(f, P("a"), P("a"), donate_argnums=1).lower(x, x).as_text()
    sig = _main_signature(text)
    assert sig.count("tf.aliasing_output = 0") == 1
    assert sig.index("tf.aliasing_output") > sig.index("%arg1")


@pytest.mark.parametrize("mode", MODES)
def test_lowered_module_object_matches_text(mode: str) -> None:
    with partitioner.spmd_partitioner(mode), mesh_ctx(*MESH_2D):
        lowered = pjit(jnp.exp, P("a"), P("a")).lower(np.zeros((8, 2), np.float32))
    module = lowered.compiler_ir()
    assert str(module) == lowered.as_text()
    hlo = lowered.compiler_ir("hlo").as_hlo_text()
    assert "exponential" in hlo and "sharding={devices=[4,1,2]" in hlo
    with pytest.raises(ValueError, match="'stablehlo' or 'hlo'"):
        lowered.compiler_ir("mhlo")


def test_jax_spec_and_our_spec_lower_identically() -> None:
    x = np.zeros((8, 8), np.float32)
    for mode in MODES:
        ours, _ = _lower(jnp.sin, P(("a", "b")), P("b"), x, mode=mode, mesh_def=MESH_2D)
        JP = jax.sharding.PartitionSpec
        theirs, _ = _lower(jnp.sin, JP(("a", "b")), JP("b"), x, mode=mode, mesh_def=MESH_2D)
        assert ours.as_text() == theirs.as_text()
