"""Where the host callback primitives meet jax: every registration, read top to bottom.

The same design as the core's ``_src/registry.py`` (docs/architecture.md, "One
home per primitive"): each rule lives where it belongs (``primitive.py`` and
``call.py``: definitions, abstract evaluation and transformation rules;
``lowering.py``: the compiled callbacks), and what jax needs to know about them
is wired here, once, in the order jax meets a primitive (trace, transform, lower,
run). ``tests/test_architecture.py`` fails on a registration anywhere else in the
package, and ``tests/primitives/test_rules_registry.py`` on a rule missing. A
registry of its own because the package sits beside the core's registry on one
layer, and neither may import the other. The package's ``__init__`` imports this module, so
importing any part of the package installs everything; importing it again
changes nothing.
"""

from __future__ import annotations

from .. import jax_private as jp
from . import call, lowering, primitive

# --- the tap effect: ordered, shardable, allowed wherever a tap may sit ---

for _effects in (
    jp.ordered_effects,
    jp.shardable_ordered_effects,
    jp.lowerable_effects,
    jp.control_flow_allowed_effects,
    jp.remat_allowed_effects,
    jp.custom_derivatives_allowed_effects,
    jp.partial_eval_kept_effects,
):
    _effects.add_type(primitive.TapEffect)

# --- id_tap_p: the identity on its operands, with a tap on the way ---

id_tap_p = primitive.id_tap_p
id_tap_p.def_effectful_abstract_eval(primitive.abstract_eval)
jp.primitive_batchers[id_tap_p] = primitive.batcher
jp.primitive_jvps[id_tap_p] = primitive.jvp
jp.primitive_transposes[id_tap_p] = primitive.transpose
jp.partial_eval_jaxpr_custom_rules[id_tap_p] = primitive.remat  # NOTE [taps under checkpoint]
# Not cached: a cached lowering gets tokens as token-typed arguments, but taps in a
# partially manual Shardy region thread carriers (NOTE [tokens as data in partial
# manual regions]); each tap is its own equation anyway.
jp.register_lowering(id_tap_p, lowering.id_tap_lowering, cacheable=False)
# jax.jit then gives the lowering its device assignment (for ``device=``).
jp.requires_devices_during_lowering(id_tap_p)
id_tap_p.def_impl(primitive.impl)

# --- call_p: a host function whose result comes back into the computation ---

call_p = call.call_p
call_p.def_effectful_abstract_eval(call.abstract_eval)
jp.primitive_batchers[call_p] = call.batcher
jp.primitive_jvps[call_p] = call.jvp  # refuses, naming the function
jp.register_lowering(call_p, lowering.call_lowering, cacheable=False)
jp.requires_devices_during_lowering(call_p)
call_p.def_impl(call.impl)

# --- jax's while loop: a tap in a batched condition (NOTE [tap in a batched while condition]) ---

jp.register_lowering(jp.while_p, lowering.while_lowering)
