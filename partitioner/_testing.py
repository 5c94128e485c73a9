"""Internals exposed for partitioner's own tests, and for debugging it.

Not part of the API: names here may change between releases without notice (the
public test support is ``partitioner.testing``: strategies, round-trip checks and
the pytest plugin). They are gathered in one module so that everything else under
``partitioner._src`` stays private, and so that a test's reach into the internals is
visible in one import line. The module re-exports names and holds the three small
helpers below; nothing else.

What is here, and why a test needs it:

- ``pjit_p``, ``sharding_constraint_p``, ``id_tap_p``, ``call_p``, ``pmap_region_p``,
  ``shift_p`` (and ``shift``), ``auto_pipeline_p`` (and ``auto_pipeline_sites``, what a
  traced program's marks say): the primitives, to check that every jax transformation
  registry has a rule for them.
- ``Sequencer``, ``TapItem``: the tap receiver's program-order bookkeeping (NOTE
  [device tap order]), driven directly with arrivals in any interleaving.
- ``executable_cache``, ``ExecutableCache``: the compile-once cache, to count its
  entries and exercise its threading contract directly.
- ``hlo_replica_groups(line, n_devices)``: the report's reader of replica groups in
  the partitioned HLO, tested on every spelling XLA writes.
- ``MAX_IN_FLIGHT``: the bound of the CPU collective window (launches of CPU
  programs with collectives that may be in flight); the window's waits are
  observable as ``window_wait`` events (``partitioner.recording``).
- ``runs_windowed(f, *args)``: whether a call goes through that window;
  ``call_is_guarded(f)``: whether ``f``'s calls run through the guard around the C++
  call (NOTE [guarded C++ calls]).
- The spec stage's helpers, tested on their own: ``broadcast_prefix``,
  ``check_spec``, ``check_specs``, ``current_mesh``, ``maybe_current_mesh``,
  ``as_auto_mesh``, ``parse_op_sharding_parsed``, ``hlo_sharding_text``,
  ``unflatten_superdims`` and the error it
  raises for an assignment that is not a transposition of the mesh, ``Unparseable``.
- ``colocated_runtime``: colocated_python's lanes, to shorten ``IDLE_S`` and see an
  idle worker end and a later call start another (NOTE [colocated lanes]).
- The lowering's Shardy attribute builders, ``sdy_sharding_attr`` and
  ``sdy_mesh_attr``, and ``ensure_sdy_mesh`` (one ``sdy.mesh`` op per distinct mesh
  in a module); they need an MLIR context with the sdy dialect.
- ``Figures`` (a plan's collective bytes, memory and time, and ``dominates``: the one
  test of "at least as good on both figures") and ``PipelineDecision``: the records
  AUTO's whole plan is judged and named by, for tests that hold it against hand plans.
- The AUTO cost model, tested on its own against XLA (NOTE [auto cost model],
  NOTE [auto layouts]): ``auto_moves`` (the collectives between two layouts),
  ``auto_candidates`` (the layouts of a shape) and ``AutoEstimator`` (one pass over a
  jaxpr to an estimate).
- Explicit axes (NOTE [explicit axes]): ``has_explicit_axes``, ``as_call_mesh``,
  ``result_mesh``, ``typed_context``, and ``run_with_unspecified_outputs(f, *args)``,
  which runs the pjit-ed ``f``'s call with every output spec unspecified (the spec
  residuals get), so the rule for such outputs can be tested on its own.
"""

from __future__ import annotations

import types
from typing import Any

from ._src import pmap_registry as _pmap_registry  # noqa: F401  (pmap_region_p's rules)
from ._src.auto.cost.layouts import candidates as auto_candidates
from ._src.auto.cost.layouts import moves as auto_moves
from ._src.auto.cost.walk import Estimator as AutoEstimator
from ._src.colocated import runtime as colocated_runtime
from ._src.compiler.cache import ExecutableCache
from ._src.compiler.cache import executables as executable_cache
from ._src.host_callback.call import call_p
from ._src.host_callback.primitive import id_tap_p
from ._src.host_callback.receiver import Sequencer, TapItem
from ._src.inspect.collectives import parse_groups as hlo_replica_groups
from ._src.lower.annotate import ensure_sdy_mesh, sdy_mesh_attr, sdy_sharding_attr
from ._src.primitives.auto_choice import Figures
from ._src.primitives.auto_pipeline import auto_pipeline_p
from ._src.primitives.auto_pipeline import sites as auto_pipeline_sites
from ._src.primitives.constraint import sharding_constraint_p
from ._src.primitives.pjit_call import pjit_p
from ._src.primitives.pmap_region import pmap_region_p
from ._src.primitives.shift import shift, shift_p
from ._src.sharding.checks import check_spec, check_specs
from ._src.sharding.mesh_env import (
    as_auto_mesh,
    as_call_mesh,
    current_mesh,
    has_explicit_axes,
    maybe_current_mesh,
    result_mesh,
    typed_context,
)
from ._src.sharding.op_sharding import (
    Unparseable,
    hlo_sharding_text,
    parse_op_sharding_parsed,
    unflatten_superdims,
)
from ._src.sharding.tree import broadcast_prefix
from ._src.trace.decision import PipelineDecision
from ._src.window import MAX_IN_FLIGHT


def call_is_guarded(f: Any) -> bool:
    """Whether the pjit-ed ``f``'s calls go through the Python guard around the C++ call.

    NOTE [guarded C++ calls]: the guard is a Python function; otherwise ``__call__``
    is jaxlib's C++ callable itself.
    """
    return isinstance(type(f).__dict__["__call__"].__func__, types.FunctionType)


def run_with_unspecified_outputs(f: Any, *args: Any) -> list[Any]:
    """Run the pjit-ed ``f`` on ``args`` with every output spec unspecified (``None``)."""
    plan = f._planner.plan(args, {})
    params = plan.params.replace(out_axis_resources=(None,) * len(plan.params.out_axis_resources))
    return params.bind(*plan.args_flat)


def runs_windowed(f: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether calling the pjit-ed ``f`` with these arguments enters the CPU window."""
    return bool(f.lower(*args, **kwargs).compile().executable.windowed)


__all__ = [
    "AutoEstimator",
    "Figures",
    "PipelineDecision",
    "auto_pipeline_p",
    "auto_pipeline_sites",
    "auto_candidates",
    "auto_moves",
    "MAX_IN_FLIGHT",
    "hlo_replica_groups",
    "pmap_region_p",
    "ExecutableCache",
    "Sequencer",
    "TapItem",
    "Unparseable",
    "as_auto_mesh",
    "as_call_mesh",
    "has_explicit_axes",
    "result_mesh",
    "run_with_unspecified_outputs",
    "typed_context",
    "broadcast_prefix",
    "call_is_guarded",
    "call_p",
    "check_spec",
    "check_specs",
    "colocated_runtime",
    "current_mesh",
    "executable_cache",
    "hlo_sharding_text",
    "id_tap_p",
    "maybe_current_mesh",
    "parse_op_sharding_parsed",
    "pjit_p",
    "runs_windowed",
    "ensure_sdy_mesh",
    "sdy_mesh_attr",
    "sdy_sharding_attr",
    "sharding_constraint_p",
    "shift",
    "shift_p",
    "unflatten_superdims",
]
