"""Where ``pmap_region_p`` meets jax: its block of ``registry.py``, loaded with pmap.

Why apart: only ``pmap`` binds a region (``planner/pmap_plan.py``, which imports
this module by name, as ``wrapped.py`` imports ``registry.py``), and a ``jit``/``pjit``
program never meets one, so ``import partitioner`` does not load the region's
rules, its manual-SPMD lowering (``lower/manual.py``) or its definition: every
object a module creates at import brings jax's first full collection closer to a
new process's first call (``lazy.py``; issue 53). The block reads as it did in
``registry.py``, in the order jax meets the primitive; ``tests/test_architecture.py``
counts this module among the registries.
"""

from __future__ import annotations

from . import jax_private as jp
from .dispatch import execute
from .lower import manual
from .primitives import pmap_region

# --- pmap_region_p: a per-device body run once on every device of an axis ---

pmap_region_p = pmap_region.pmap_region_p
pmap_region_p.def_effectful_abstract_eval(pmap_region.abstract_eval)
jp.pp_eqn_rules[pmap_region_p] = pmap_region.pp_rule
jp.fancy_primitive_batchers[pmap_region_p] = pmap_region.batcher
jp.primitive_jvps[pmap_region_p] = pmap_region.jvp
jp.primitive_transposes[pmap_region_p] = pmap_region.transpose
jp.custom_partial_eval_rules[pmap_region_p] = pmap_region.partial_eval
jp.partial_eval_jaxpr_custom_rules[pmap_region_p] = pmap_region.partial_eval_custom
jp.dce_rules[pmap_region_p] = pmap_region.dce
jp.register_lowering(pmap_region_p, manual.region_lowering, cacheable=False)
pmap_region_p.def_impl(execute.region_impl)
