"""Helpers shared by the client-library tests (flax linen, flax nnx, optax).

Spec trees here are what those libraries hand users: pytree prefixes of a
training state whose leaves are PartitionSpecs or None (replicated).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tests.helpers import assert_laid_out

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (its ``main`` is not run), so a test and the
    example it checks cannot drift apart."""
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_spec(x: Any) -> bool:
    """A spec-tree leaf: a PartitionSpec or None (replicated)."""
    return x is None or isinstance(x, PartitionSpec)


def named_shardings(mesh: Mesh, specs: Any) -> Any:
    """The NamedShardings ``jax.jit`` takes for a spec tree (None: replicated)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s or PartitionSpec()), specs, is_leaf=is_spec)


def assert_tree_laid_out(tree: Any, mesh: Mesh, specs: Any) -> None:
    """Every array under each leaf of the prefix ``specs`` is laid out as its spec says.

    Numeric arrays are checked shard by shard (see ``helpers.assert_laid_out``);
    typed PRNG keys, which have no numpy value, by sharding equivalence.
    """

    def check(spec: Any, subtree: Any) -> None:
        for leaf in jax.tree.leaves(subtree):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                wanted = NamedSharding(mesh, spec or PartitionSpec())
                assert leaf.sharding.is_equivalent_to(wanted, leaf.ndim), (leaf.sharding, spec)
            else:
                assert_laid_out(leaf, mesh, spec)

    jax.tree.map(check, specs, tree, is_leaf=is_spec)


def assert_specs_mirror(specs: Any, tree: Any) -> None:
    """``specs`` has exactly ``tree``'s structure, empty nodes (EmptyState, MaskedNode) included."""
    assert jax.tree.structure(specs, is_leaf=is_spec) == jax.tree.structure(tree)
