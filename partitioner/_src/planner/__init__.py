"""The front doors' planners: options parsed once into a record, each call's arguments -> CallPlan.

``jit_info.py`` / ``pmap_info.py`` parse what the user passed when wrapping a
function into a frozen record (as jax's ``PjitInfo``: the user's own parameter
names and the rules that tell front doors apart are data, not subclasses or
string switches); ``jit_plan.py`` / ``pmap_plan.py`` are free functions over a
record that turn one call into a :class:`CallPlan`; ``pmap_devices.py`` picks a
map's devices. The front doors (``jit.py``, ``pjit.py``, ``pmap.py``) only parse
and wrap; the dispatcher and the stages ask a :class:`Planner` for plans.
"""
