"""Where partitioner's primitives meet jax: every registration, read top to bottom.

Why one module: a primitive's pieces live at the stage that needs them (its
definition, abstract evaluation and transformation rules in ``primitives/``, its
MLIR lowering in ``lower/``, its eager impl in ``dispatch/``), because the impl
runs the build pipeline and the lowering annotates shardings: one file per
primitive, as jax writes its own, would pull the primitive above the stages
that use it. What jax needs to know about each primitive is then wired here,
once, in the order jax meets a primitive (trace, transform, lower, run), so
"what does jax do with ``pjit_p``" is one block to read.
``tests/test_architecture.py`` checks that no registration happens anywhere
else, and ``tests/primitives/test_rules_registry.py`` that no primitive misses one.
Importing this module (the front doors' common module does) installs everything,
jax's two process-wide patches included; importing it again changes nothing.
The host callback package keeps its own two primitives in its own registry
(``host_callback/registry.py``), and ``pmap_region_p`` has its block in
``pmap_registry.py``, loaded with pmap's planner: they sit beside this module on
one layer, and none imports another. A ``jit``/``pjit`` program never meets them,
so ``import partitioner`` does not load them (``lazy.py``).
"""

from __future__ import annotations

from . import jax_private as jp
from .dispatch import execute
from .lower import nested
from .primitives import auto_pipeline, constraint, pjit_call, shift

# --- pjit_p: a partitioned call of a traced body over a mesh ---

pjit_p = pjit_call.pjit_p
pjit_p.def_effectful_abstract_eval(pjit_call.abstract_eval)
jp.pp_eqn_rules[pjit_p] = pjit_call.pp_rule
jp.fancy_primitive_batchers[pjit_p] = pjit_call.batcher
jp.primitive_jvps[pjit_p] = pjit_call.jvp
jp.primitive_transposes[pjit_p] = pjit_call.transpose
jp.custom_partial_eval_rules[pjit_p] = pjit_call.partial_eval
jp.partial_eval_jaxpr_custom_rules[pjit_p] = pjit_call.partial_eval_custom
jp.dce_rules[pjit_p] = pjit_call.dce
jp.register_lowering(pjit_p, nested.pjit_lowering, cacheable=False)
pjit_p.def_impl(execute.pjit_impl)

# --- sharding_constraint_p: pin a value's layout inside a body ---

sharding_constraint_p = constraint.sharding_constraint_p
sharding_constraint_p.def_abstract_eval(constraint.abstract_eval)
jp.fancy_primitive_batchers[sharding_constraint_p] = constraint.batcher
jp.primitive_jvps[sharding_constraint_p] = constraint.jvp
jp.primitive_transposes[sharding_constraint_p] = constraint.transpose
jp.register_lowering(sharding_constraint_p, nested.constraint_lowering)
sharding_constraint_p.def_impl(execute.constraint_impl)

# --- shift_p: a roll along one dimension, transposed as the roll back (a pipeline's step) ---

shift_p = shift.shift_p
shift_p.def_abstract_eval(shift.abstract_eval)
jp.fancy_primitive_batchers[shift_p] = shift.batcher
jp.primitive_jvps[shift_p] = shift.jvp
jp.primitive_transposes[shift_p] = shift.transpose
jp.register_lowering(shift_p, shift.lowering)
shift_p.def_impl(shift.impl)

# --- auto_pipeline_p: the mark an AUTO pipeline leaves for its call (NOTE [pipeline decision]) ---

auto_pipeline_p = auto_pipeline.auto_pipeline_p
auto_pipeline_p.def_abstract_eval(auto_pipeline.abstract_eval)
jp.partial_eval_jaxpr_custom_rules[auto_pipeline_p] = auto_pipeline.partial_eval_custom
jp.dce_rules[auto_pipeline_p] = auto_pipeline.dce
jp.register_lowering(auto_pipeline_p, auto_pipeline.lowering)
auto_pipeline_p.def_impl(auto_pipeline.impl)

# --- an enclosing jax.jit sees our primitives' devices (NOTE [device assignment under jax.jit]) ---

jp.report_intermediate_shardings(nested.intermediate_shardings)

# --- collectives in a pmap body take negative axes (NOTE [negative collective axes]) ---

# jax 0.10.2 gets them wrong before any rule of a primitive runs (an untiled
# all_to_all builds its shapes from the raw axes), so the fix wraps the API, as
# jax's own later fix does, for the whole process.
jp.canonicalize_collective_axes()
