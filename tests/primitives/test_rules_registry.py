"""Every partitioner primitive has every rule jax needs.

A primitive missing a rule only fails when a user happens to combine it with
the one transformation that needs it; this test fails as soon as a rule is
missing instead.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import core
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe

import partitioner  # noqa: F401  (registers every rule)
from partitioner import PartitionSpec as P
from partitioner import with_sharding_constraint
from partitioner._testing import (
    call_p,
    id_tap_p,
    pjit_p,
    pmap_region_p,
    sharding_constraint_p,
    shift_p,
)
from tests.helpers import MESH_2D, mesh_ctx
from tests.primitives.rules_helpers import assert_tree_close, constraint_eqns


def _has_impl(prim: Any) -> bool:
    return "impl" in vars(prim)  # set by def_impl; the class default raises


def _has_abstract_eval(prim: Any) -> bool:
    return "abstract_eval" in vars(prim)


def _has_lowering(prim: Any) -> bool:
    return prim in mlir._lowerings or any(
        prim in rules for rules in mlir._platform_specific_lowerings.values()
    )


def _has_transpose(prim: Any) -> bool:
    return prim in ad.primitive_transposes or prim in ad.fancy_transposes


RULES = {
    "impl": _has_impl,
    "abstract eval": _has_abstract_eval,
    "MLIR lowering": _has_lowering,
    "JVP": lambda p: p in ad.primitive_jvps,
    "transpose": _has_transpose,
    "batching": lambda p: p in batching.fancy_primitive_batchers,
    "partial eval": lambda p: p in pe.custom_partial_eval_rules,
    "partial eval custom (remat)": lambda p: p in pe.partial_eval_jaxpr_custom_rules,
    "DCE": lambda p: p in pe.dce_rules,
}

# sharding_constraint_p is a plain (non-call) primitive: jax's generic partial
# eval, partial_eval_jaxpr_custom and DCE paths handle it (tested below).
CONSTRAINT_RULES = ("impl", "abstract eval", "MLIR lowering", "JVP", "transpose", "batching")


@pytest.mark.parametrize("rule", list(RULES))
def test_pjit_p_has_rule(rule: str) -> None:
    assert RULES[rule](pjit_p), f"pjit_p has no {rule} rule"


@pytest.mark.parametrize("rule", list(RULES))
def test_pmap_region_p_has_rule(rule: str) -> None:
    assert RULES[rule](pmap_region_p), f"pmap_region_p has no {rule} rule"


@pytest.mark.parametrize("rule", CONSTRAINT_RULES)
def test_sharding_constraint_p_has_rule(rule: str) -> None:
    assert RULES[rule](sharding_constraint_p), f"sharding_constraint_p has no {rule} rule"


# shift_p is a plain linear primitive: jax's generic partial eval, remat and DCE paths
# handle it.
SHIFT_RULES = ("impl", "abstract eval", "MLIR lowering", "JVP", "transpose", "batching")


@pytest.mark.parametrize("rule", SHIFT_RULES)
def test_shift_p_has_rule(rule: str) -> None:
    assert RULES[rule](shift_p), f"shift_p has no {rule} rule"


# id_tap_p is a plain effectful primitive too: jax's generic partial eval (which keeps
# an effectful equation with known inputs in the known pass), remat and DCE (which
# keeps effectful equations) handle it.
TAP_RULES = ("impl", "abstract eval", "MLIR lowering", "JVP", "transpose", "batching")


@pytest.mark.parametrize("rule", TAP_RULES)
def test_id_tap_p_has_rule(rule: str) -> None:
    assert RULES[rule](id_tap_p), f"id_tap_p has no {rule} rule"


# call_p has no transpose: its JVP rule refuses differentiation with a clear error.
@pytest.mark.parametrize("rule", [r for r in TAP_RULES if r != "transpose"])
def test_call_p_has_rule(rule: str) -> None:
    assert RULES[rule](call_p), f"call_p has no {rule} rule"


def test_every_registered_rule_is_ours() -> None:
    # No rule is inherited by accident from a jax primitive of the same name.
    for prim in (pjit_p, sharding_constraint_p, pmap_region_p, shift_p):
        for registry in (ad.primitive_jvps, batching.fancy_primitive_batchers):
            assert registry[prim].__module__.startswith("partitioner."), (prim, registry[prim])
    assert pjit_p.multiple_results and not sharding_constraint_p.multiple_results


def test_sharding_constraint_p_uses_the_generic_non_call_paths() -> None:
    assert not sharding_constraint_p.call_primitive
    assert not getattr(sharding_constraint_p, "map_primitive", False)
    assert sharding_constraint_p not in pe.custom_partial_eval_rules
    assert sharding_constraint_p not in pe.dce_rules

    def f(x: Any, y: Any) -> Any:
        a = with_sharding_constraint(jnp.sin(x), P("a"))
        b = with_sharding_constraint(a * y, P(None, "b"))
        unused = with_sharding_constraint(x * 2, P("b"))
        del unused
        return a, b

    x, y = np.ones((8, 4), np.float32), np.full((8, 4), 2.0, np.float32)
    with mesh_ctx(*MESH_2D):
        closed = jax.make_jaxpr(f)(x, y)
    assert len(constraint_eqns(closed)) == 3

    # Partial eval with y unknown: the first constraint is known, the second staged.
    known, unknown, out_uk, res_avals = pe.partial_eval_jaxpr_nounits(
        closed, unknowns=[False, True], instantiate=False
    )
    assert out_uk == [False, True]
    assert len(constraint_eqns(known)) >= 1
    assert len(constraint_eqns(unknown)) == 1
    assert len(res_avals) >= 1

    # DCE drops the constraint whose value is unused, and one whose output is dropped.
    dced, used_inputs = pe.dce_jaxpr(closed.jaxpr, [True, False])
    assert used_inputs == [True, False]
    assert len(constraint_eqns(dced)) == 1

    # partial_eval_jaxpr_custom (remat) handles it without a special rule.
    jk, js, uk_out, inst_out, num_res = pe.partial_eval_jaxpr_custom(
        closed.jaxpr, [False, True], [True, True], False, False, lambda *_, **__: False
    )
    assert uk_out == [False, True]
    assert constraint_eqns(jk) and constraint_eqns(js)

    # And the transformed results still compute f.
    with mesh_ctx(*MESH_2D):
        want = jax.jit(lambda x, y: (jnp.sin(x), jnp.sin(x) * y))(x, y)
        assert_tree_close(tuple(core.jaxpr_as_fun(closed)(x, y)), want)
        ck = jax.checkpoint(lambda x, y: jnp.sum(f(x, y)[1]), policy=lambda *_, **__: False)
        assert_tree_close(
            jax.grad(ck, argnums=(0, 1))(x, y),
            jax.grad(lambda x, y: jnp.sum(jnp.sin(x) * y), argnums=(0, 1))(x, y),
        )


TRANSFORMATION_REGISTRIES = {
    "JVP": ad.primitive_jvps,
    "transpose": ad.primitive_transposes,
    "batching": batching.fancy_primitive_batchers,
    "partial eval": pe.custom_partial_eval_rules,
    "partial eval custom (remat)": pe.partial_eval_jaxpr_custom_rules,
    "DCE": pe.dce_rules,
}


@pytest.mark.parametrize(
    "prim", [pjit_p, sharding_constraint_p, pmap_region_p, id_tap_p], ids=lambda p: p.name
)
def test_a_primitives_transformation_rules_live_in_one_module(prim: Any) -> None:
    """One home per primitive: "what does vmap do to pjit" is one file to open."""
    homes = {}
    for kind, registry in TRANSFORMATION_REGISTRIES.items():
        rule = registry.get(prim)
        if rule is not None:
            # A plain batcher is registered through a proxy that wraps it: its
            # closure holds ours.
            inner = [c.cell_contents for c in getattr(rule, "__closure__", None) or ()]
            rule = (
                next((c for c in inner if callable(c)), rule)
                if "Proxy" in rule.__qualname__
                else rule
            )
            homes[kind] = getattr(rule, "__module__", None) or "jax."
    ours = {kind: home for kind, home in homes.items() if not home.startswith("jax.")}
    assert len(ours) >= 3 and len(set(ours.values())) == 1, homes  # jax's wrappers aside
