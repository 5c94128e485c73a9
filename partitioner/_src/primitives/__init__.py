"""Stage 3: partitioner's primitives, one module each: definition, typed params, abstract eval, every rule.

``pjit_call.py`` (``pjit_p``), ``constraint.py`` (``sharding_constraint_p``) and
``pmap_region.py`` (``pmap_region_p``); ``call_plan.py`` holds what a planner hands
dispatch (``CallPlan``, ``Planner``). Nothing here registers itself: ``registry.py``
wires every rule into jax, in one place.
"""
