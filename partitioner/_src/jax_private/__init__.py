"""Every private jax entry point partitioner uses, in one place.

Why: ``jax._src`` moves between releases. Keeping each use behind a name or a
small function here means a jax upgrade touches one module, and fails at import,
here, when a name is gone. Nothing outside this file imports from ``jax._src``.

This module exports *names*, never modules: the block of named exports below
(``ClosedJaxpr = _core.ClosedJaxpr``) lists every private jax object the package
reads, and the modules it reads them from are bound to private names (``_core``).
Elsewhere, code reads ``jp.ClosedJaxpr``, never ``jp.core.ClosedJaxpr``
(tests/test_architecture.py checks both).
"""

from __future__ import annotations

import operator as _operator
import os as _os
import re as _re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax as _jax_pkg
import numpy as _np
from jax._src import api_util as _api_util
from jax._src import array as _array
from jax._src import callback as _callback
from jax._src import compilation_cache as _compilation_cache
from jax._src import compiler as _compiler
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import dtypes as _dtypes
from jax._src import effects as _effects
from jax._src import linear_util as _lu
from jax._src import mesh as _mesh_lib
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src import stages as _stages
from jax._src import tree_util as _tree_util
from jax._src import util as _util
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe
from jax._src.interpreters import pxla as _pxla
from jax._src.lax import parallel as _parallel
from jax._src.lax.control_flow import loops as _loops
from jax._src.lib import _jax
from jax._src.lib import hlo as _hlo
from jax._src.lib import xla_client as _xla_client
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _stablehlo
from jax._src.lib.mlir.dialects import sdy as _sdy
from jax.sharding import Mesh as _Mesh
from jax.sharding import NamedSharding as _NamedSharding
from jax.sharding import PartitionSpec as _P

# --- the jax releases this module is written against ---

#: ``(lowest, first unsupported)`` jax release, as ``(major, minor)``; pyproject pins the same.
SUPPORTED_JAX = ((0, 10), (0, 11))


def check_jax_version(version: str) -> None:
    """Raise ImportError unless ``version`` is a jax release this module supports.

    Every name below is private to jax and may change in any release, so an
    unsupported jax fails here, at import, with what to install, rather than
    later with an AttributeError deep inside a trace or a lowering.
    """
    found = _re.match(r"(\d+)\.(\d+)", version)
    low, high = SUPPORTED_JAX
    if found is None or not low <= (int(found[1]), int(found[2])) < high:
        raise ImportError(
            f"partitioner supports jax {low[0]}.{low[1]}.x (it builds on jax's private "
            f"API, which changes between releases); found jax {version}. Install "
            f'"jax>={low[0]}.{low[1]},<{high[0]}.{high[1]}" and the matching jaxlib.'
        )


check_jax_version(_jax_pkg.__version__)


# --- named exports: the private jax names partitioner uses, one line each ---
# Grouped by jax module and sorted. Elsewhere use `jp.Name`, never a module's
# attribute: tests/test_architecture.py fails on a module exported from here.

# jax._src.api_util
debug_info = _api_util.debug_info

# jax._src.core
ClosedJaxpr = _core.ClosedJaxpr
DropVar = _core.DropVar
eqn_effects = _core.eqn_effects
eval_jaxpr = _core.eval_jaxpr
extend_axis_env_nd = _core.extend_axis_env_nd
Jaxpr = _core.Jaxpr
jaxprs_in_params = _core.jaxprs_in_params
Literal = _core.Literal
new_jaxpr_eqn = _core.new_jaxpr_eqn
positional_effects = _core.positional_effects
pp_eqn_rules = _core.pp_eqn_rules
Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
subjaxprs = _core.subjaxprs
Tracer = _core.Tracer
typeof = _core.typeof
Var = _core.Var

# jax._src.effects
control_flow_allowed_effects = _effects.control_flow_allowed_effects
custom_derivatives_allowed_effects = _effects.custom_derivatives_allowed_effects
Effect = _effects.Effect
lowerable_effects = _effects.lowerable_effects
ordered_effects = _effects.ordered_effects
partial_eval_kept_effects = _effects.partial_eval_kept_effects
remat_allowed_effects = _effects.remat_allowed_effects
shardable_ordered_effects = _effects.shardable_ordered_effects

# jax._src.interpreters.ad
backward_pass = _ad.backward_pass
instantiate_zeros = _ad.instantiate_zeros
is_undefined_primal = _ad.is_undefined_primal
jvp_jaxpr = _ad.jvp_jaxpr
primitive_jvps = _ad.primitive_jvps
primitive_transposes = _ad.primitive_transposes
UndefinedPrimal = _ad.UndefinedPrimal
Zero = _ad.Zero

# jax._src.interpreters.batching
batch_jaxpr = _batching.batch_jaxpr
fancy_primitive_batchers = _batching.fancy_primitive_batchers
moveaxis = _batching.moveaxis
primitive_batchers = _batching.primitive_batchers

# jax._src.interpreters.mlir
aval_to_ir_type = _mlir.aval_to_ir_type
call_lowering = _mlir.call_lowering
custom_call = _mlir.custom_call
iota = _mlir.iota
ir_constants = _mlir.ir_constants
ir_tree_registry = _mlir.ir_tree_registry
jaxpr_subcomp = _mlir.jaxpr_subcomp
lower_fun = _mlir.lower_fun
lower_jaxpr_to_module = _mlir.lower_jaxpr_to_module
LoweringParameters = _mlir.LoweringParameters
register_lowering = _mlir.register_lowering
token_type = _mlir.token_type
TokenSet = _mlir.TokenSet
wrap_with_full_to_shard_op = _mlir.wrap_with_full_to_shard_op
wrap_with_shard_to_full_op = _mlir.wrap_with_shard_to_full_op
wrap_with_sharding_op = _mlir.wrap_with_sharding_op

# jax._src.interpreters.partial_eval
closed_call_partial_eval_custom_rule = _pe.closed_call_partial_eval_custom_rule
convert_constvars_jaxpr = _pe.convert_constvars_jaxpr
custom_partial_eval_rules = _pe.custom_partial_eval_rules
dce_jaxpr = _pe.dce_jaxpr
dce_jaxpr_consts = _pe.dce_jaxpr_consts
dce_rules = _pe.dce_rules
has_effects = _pe.has_effects
JaxprTracer = _pe.JaxprTracer
new_eqn_recipe = _pe.new_eqn_recipe
partial_eval_jaxpr_custom = _pe.partial_eval_jaxpr_custom
partial_eval_jaxpr_custom_rules = _pe.partial_eval_jaxpr_custom_rules
partial_eval_jaxpr_nounits = _pe.partial_eval_jaxpr_nounits
partial_eval_jaxpr_nounits_fwd = _pe.partial_eval_jaxpr_nounits_fwd
PartialVal = _pe.PartialVal
prune_closed_jaxpr_outputs = _pe.prune_closed_jaxpr_outputs
trace_to_jaxpr_dynamic = _pe.trace_to_jaxpr_dynamic

# jax._src.interpreters.pxla
manual_proto = _pxla.manual_proto

# jax._src.lax.control_flow.loops
while_p = _loops.while_p

# jax._src.linear_util
wrap_init = _lu.wrap_init

# jax._src.sharding_impls
SdyArray = _sharding_impls.SdyArray
SdyArrayList = _sharding_impls.SdyArrayList
ShardingContext = _sharding_impls.ShardingContext
SPMDAxisContext = _sharding_impls.SPMDAxisContext

# jax._src.source_info_util
current_source_info = _source_info_util.current
summarize_source_info = _source_info_util.summarize

# jax._src.xla_bridge
backends_are_initialized = _xla_bridge.backends_are_initialized
get_device_backend = _xla_bridge.get_device_backend

# jaxlib._jax
DeviceList = _jax.DeviceList

# jaxlib.mlir.dialects.sdy
AxisRefAttr = _sdy.AxisRefAttr
DimensionShardingAttr = _sdy.DimensionShardingAttr
ManualAxesAttr = _sdy.ManualAxesAttr
ManualComputationOp = _sdy.ManualComputationOp
MeshAttr = _sdy.MeshAttr
MeshAxisAttr = _sdy.MeshAxisAttr
MeshOp = _sdy.MeshOp
sdy_return = _sdy.return_
sdy_sharding_constraint = _sdy.sharding_constraint
TensorShardingAttr = _sdy.TensorShardingAttr
TensorShardingPerValueAttr = _sdy.TensorShardingPerValueAttr

# jaxlib.mlir.ir
ArrayAttr = _ir.ArrayAttr
Block = _ir.Block
BoolAttr = _ir.BoolAttr
DictAttr = _ir.DictAttr
FunctionType = _ir.FunctionType
InsertionPoint = _ir.InsertionPoint
Location = _ir.Location
StringAttr = _ir.StringAttr
TypeAttr = _ir.TypeAttr

# jaxlib.xla_client
HloSharding = _xla_client.HloSharding
OpSharding = _xla_client.OpSharding

# Private in jax (a leading underscore) with no public equivalent: read here only,
# so a jax upgrade that renames one fails at import, in this file.
jaxpr_forwarding = _pe._jaxpr_forwarding  # per output: the input it forwards, or None
# --- end of named exports ---


# Source locations jax records for equations (and XLA keeps in op metadata) name the
# user's line, not partitioner's: jax skips its own files the same way.
_source_info_util.register_exclusion(_os.path.dirname(_os.path.dirname(__file__)))  # _src/


# --- the ambient mesh (shared with `with jax.sharding.Mesh(...)`) ---


def _sync_mesh_config() -> None:
    # jax keys its own caches on this config value; keep it in step exactly as
    # `Mesh.__enter__` does so jax.jit sees our mesh the way it sees its own.
    stack = _mesh_lib.thread_resources.stack
    _config.mesh_context_manager.set_local(
        tuple(t.physical_mesh for t in stack if not t.physical_mesh.empty)
    )


def push_mesh(mesh: Any) -> None:
    """Enter ``mesh`` on jax's thread-local resource stack (no deprecation warning)."""
    res = _mesh_lib.thread_resources
    env = res.stack[-1].with_mesh(mesh)
    res.stack.append(env)
    res.env = env
    _sync_mesh_config()


def pop_mesh() -> None:
    """Leave the innermost mesh pushed by :func:`push_mesh` or ``with Mesh``."""
    res = _mesh_lib.thread_resources
    res.stack.pop()
    res.env = res.stack[-1]
    _sync_mesh_config()


def ambient_mesh() -> Any | None:
    """The innermost mesh in context, or None.

    `with Mesh` and `partitioner.mesh` share jax's resource stack, so they nest in
    either order; a mesh set with ``jax.set_mesh`` is used when neither is active.
    """
    physical = _mesh_lib.thread_resources.env.physical_mesh
    if not physical.empty:
        return physical
    concrete = _mesh_lib.get_concrete_mesh()
    if concrete is not None and not concrete.empty:
        return concrete
    return None


def context_meshes() -> tuple[Any | None, Any | None]:
    """(the classic ``with mesh:`` mesh, the ``jax.set_mesh`` mesh), each None when not set.

    jax's two doors read different ones: its pjit the classic resource
    environment, jax.jit the mesh ``jax.set_mesh`` sets (``planner/jit_info.py``).
    """
    physical = _mesh_lib.thread_resources.env.physical_mesh
    concrete = _mesh_lib.get_concrete_mesh()
    return (
        None if physical.empty else physical,
        None if concrete is None or concrete.empty else concrete,
    )


def legacy_mesh_active() -> bool:
    """Whether a classic ``with mesh:`` (or ``partitioner.mesh``) context is active.

    jax's pjit reads a ``None`` spec as replicated only there (its resource
    environment); under ``jax.set_mesh`` it is unspecified.
    """
    return not _mesh_lib.thread_resources.env.physical_mesh.empty


def trace_context_names() -> tuple[str, ...]:
    """The names of the :func:`trace_context` entries, in order (for cache-miss explanations)."""
    return tuple(_config.trace_context_names())


#: Context managers setting the abstract / concrete mesh jax's sharding rules read
#: (jax's pjit sets both while tracing a body over a mesh with Explicit axes).
use_abstract_mesh = _mesh_lib.use_abstract_mesh
use_concrete_mesh = _sharding_impls._internal_use_concrete_mesh
get_abstract_mesh = _mesh_lib.get_abstract_mesh


def trace_context() -> Any:
    """jax's hashable trace-affecting configuration (x64, etc.) for cache keys."""
    return _config.trace_context()


def shardy_config(enabled: bool) -> Any:
    """Context manager setting jax's ``jax_use_shardy_partitioner`` for this thread."""
    return _config.use_shardy_partitioner(enabled)


def no_tracing() -> bool:
    """``jax.no_tracing()`` is on: a call that would trace must raise, as jax.jit's does."""
    return bool(_config.no_tracing.value)


def no_execution() -> bool:
    """``jax.no_execution()`` is on: running a program must raise, as jax.jit's does."""
    return bool(_config.no_execution.value)


def jax_uses_shardy() -> bool:
    return bool(_config.use_shardy_partitioner.value)


def shaped_abstractify(x: Any) -> Any:
    """The ShapedArray partitioner traces ``x`` as: shape, dtype and weak type only.

    jax 0.10.2 avals of committed arrays also carry their mesh; the layout is
    partitioner's business (the specs), so it is dropped and equal shapes share
    one trace whatever their current layout.
    """
    a = _core.shaped_abstractify(x)
    if isinstance(a, _core.AbstractToken):
        return a
    return _core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)


def is_token(x: Any) -> bool:
    """Whether ``x`` is an ordering token (``jax.lax.create_token()``), or its abstract value."""
    return isinstance(x, (_core.Token, _core.AbstractToken)) or isinstance(
        getattr(x, "aval", None), _core.AbstractToken
    )


def typed_abstractify(x: Any) -> Any:
    """The aval jax.jit traces ``x`` as, sharding included (``float32[8@x,4]``).

    Used over meshes with Explicit axes, where the sharding is part of the type.
    """
    return _core.shaped_abstractify(x)


# --- how an enclosing jax.jit picks its devices ---


def report_intermediate_shardings(find: Callable[[Any], Iterable[tuple[Any, Any, str]]]) -> None:
    """Let ``jax.jit`` see the shardings our primitives name inside its jaxpr.

    NOTE [device assignment under jax.jit]: jax.jit picks the devices of the
    program it builds from its arguments, its out_shardings and the shardings
    ``dispatch.get_intermediate_shardings`` finds in the jaxpr, which knows only
    jax's own primitives (there is no registry). With uncommitted (numpy)
    arguments a pjit inside jax.jit would then run on one device. So that
    function is wrapped: ``find(jaxpr)`` yields ``(sharding, source_info,
    primitive name)`` for our equations *at that level*; jax's own recursion into
    sub-jaxprs goes through the module attribute, hence through the wrapper too.
    Installing twice is a no-op.

    The patch is process-wide: every ``jax.jit`` in the process calls the
    wrapper, which returns what jax's function returns plus, for our equations
    only, the shardings ``find`` yields (a jaxpr without them is unaffected).
    It relies on two facts of jax 0.10 that :func:`check_intermediate_shardings_hook`
    verifies before patching (see docs/architecture.md, "The patch of
    get_intermediate_shardings").
    """
    check_intermediate_shardings_hook()
    original = _dispatch.get_intermediate_shardings
    if getattr(original, "_partitioner_find", None) is not None:
        return

    def get_intermediate_shardings(jaxpr: Any) -> list[Any]:
        found = list(original(jaxpr))
        found.extend((s, _stages.SourceInfo(src, name)) for s, src, name in find(jaxpr))
        return found

    get_intermediate_shardings._partitioner_find = find  # type: ignore[attr-defined]
    _dispatch.get_intermediate_shardings = get_intermediate_shardings  # type: ignore[assignment]


def body_shardings(jaxpr: Any) -> list[tuple[Any, str, str]]:
    """The shardings a body names inside (constraints, ``device_put``, nested calls,
    ours included), each with what and where it is, as jax.jit finds them to
    choose a call's devices: ``(sharding, "sharding_constraint", "f.py:3")``."""
    found = []
    for sharding, info in _dispatch.get_intermediate_shardings(jaxpr):
        if not isinstance(sharding, _jax_pkg.sharding.Sharding) or (
            isinstance(sharding, _jax_pkg.sharding.NamedSharding)
            and isinstance(sharding.mesh, _mesh_lib.AbstractMesh)
        ):
            continue  # unspecified, or over no devices yet: nothing to place the call on
        where = summarize_source_info(info.source_info) if info.source_info else "?"
        found.append((sharding, info.eqn_name, where))
    return found


def check_intermediate_shardings_hook() -> None:
    """Raise ImportError unless jax still finds intermediate shardings the way we patch.

    The wrapper works only if ``dispatch.get_intermediate_shardings(jaxpr)`` exists
    and ``pxla`` (which lowers every ``jax.jit``) reads it through the ``dispatch``
    module at call time. A jax that renamed or moved it would silently run a
    pjit nested in ``jax.jit`` on one device, so this fails loudly instead.
    """
    hook = getattr(_dispatch, "get_intermediate_shardings", None)
    if not callable(hook) or getattr(_pxla, "dispatch", None) is not _dispatch:
        raise ImportError(
            f"partitioner: jax {_jax_pkg.__version__} no longer has "
            "jax._src.dispatch.get_intermediate_shardings read by pxla through the dispatch "
            "module, which partitioner wraps so that jax.jit sees the meshes of its pjits; "
            f"install a supported jax ({SUPPORTED_JAX[0][0]}.{SUPPORTED_JAX[0][1]}.x)."
        )


# --- negative axes of psum_scatter and all_to_all (a backport) ---


def canonicalize_collective_axes() -> None:
    """Let ``lax.psum_scatter`` and ``lax.all_to_all`` count negative axes from the end.

    NOTE [negative collective axes]: jax 0.10.2 binds ``reduce_scatter_p`` and
    ``all_to_all_p`` with the axes as given. A negative ``scatter_dimension``,
    ``split_axis`` or ``concat_axis`` then fails to lower (StableHLO wants them
    non-negative; a negative all_to_all axis crashes the process), and an untiled
    ``all_to_all`` computes its shapes wrong before anything is bound (it compares
    and shifts the raw axes). jax fixed it in the API functions (jax-ml/jax
    abc5c627, 2026: each leaf's axes canonicalized against its rank), the only
    place a fix can go; this installs the same canonicalization around the two
    functions those APIs (and their async forms) call, ``_psum_scatter_is_async``
    and ``_all_to_all_is_async``, read through the module at call time.

    Process-wide, like :func:`report_intermediate_shardings`: jax.pmap and
    shard_map get the fix too. Non-negative axes take jax's own path unchanged;
    an axis out of range is jax's ``ValueError`` naming it and the rank.
    Installing twice is a no-op.
    """
    for name in ("_psum_scatter_is_async", "_all_to_all_is_async"):
        if not callable(getattr(_parallel, name, None)):
            raise ImportError(
                f"partitioner: jax {_jax_pkg.__version__} has no jax._src.lax.parallel.{name}, "
                "which partitioner wraps so that collectives take negative axes; install a "
                f"supported jax ({SUPPORTED_JAX[0][0]}.{SUPPORTED_JAX[0][1]}.x)."
            )
    if getattr(_parallel._all_to_all_is_async, "_partitioner_canonical", False):
        return
    psum_scatter, all_to_all = _parallel._psum_scatter_is_async, _parallel._all_to_all_is_async

    def _psum_scatter_is_async(
        x: Any, axis_name: Any, *, scatter_dimension: int = 0, **kw: Any
    ) -> Any:
        def one(leaf: Any) -> Any:
            dim = _util.canonicalize_axis(scatter_dimension, _np.ndim(leaf))
            return psum_scatter(leaf, axis_name, scatter_dimension=dim, **kw)

        return _tree_util.tree_map(one, x)

    def _all_to_all_is_async(
        x: Any, axis_name: Any, split_axis: int, concat_axis: int, **kw: Any
    ) -> Any:
        def one(leaf: Any) -> Any:
            rank = _np.ndim(leaf)
            split, concat = (_util.canonicalize_axis(a, rank) for a in (split_axis, concat_axis))
            return all_to_all(leaf, axis_name, split, concat, **kw)

        return _tree_util.tree_map(one, x)

    wrapper: Any
    for wrapper in (_psum_scatter_is_async, _all_to_all_is_async):
        wrapper._partitioner_canonical = True
        setattr(_parallel, wrapper.__name__, wrapper)


# --- extended dtypes (typed PRNG keys): logical vs physical arrays ---


def physical_aval(aval: Any) -> Any:
    """The aval XLA sees: a ``key<fry>[8]`` is ``u32[8, 2]``; other avals unchanged."""
    return _core.physical_aval(aval)


def is_extended(aval: Any) -> bool:
    """True for an extended dtype (typed PRNG keys), whose physical shape is longer."""
    return isinstance(getattr(aval, "dtype", None), _dtypes.ExtendedDType)


def physical_array(x: Any) -> Any:
    """The array of physical buffers behind ``x`` (a key array's ``u32`` data); else ``x``."""
    return getattr(x, "_base_array", x) if is_extended(x) else x


def key_impl(dtype: Any) -> Any:
    """The PRNG implementation of a typed key dtype (for ``jax.random.wrap_key_data``)."""
    return dtype._impl


def physical_sharding(aval: Any, sharding: Any) -> Any:
    """The sharding of the physical array behind a value of ``aval`` laid out as ``sharding``."""
    return _sharding_impls.physical_sharding(aval, sharding) if is_extended(aval) else sharding


def pp_eqn(eqn: Any, context: Any, settings: Any) -> Any:
    """jax's default pretty-printing of an equation (for a custom ``pp_eqn_rules`` entry)."""
    return _core._pp_eqn(eqn, context, settings)


# --- runtime tokens: ordered effects across executions ---


def token_inputs(effects: Any, devices: Any) -> list[Any]:
    """The input token buffer of each ordered effect, for a launch on ``devices``.

    jax keeps, per effect, the token the last launch returned (``dispatch.runtime_tokens``),
    so launches of any program with the effect run their effects in launch order, and
    ``jax.effects_barrier()`` waits for them.
    """
    return [_dispatch.runtime_tokens.get_token_input(e, list(devices))._buf for e in effects]


def record_tokens(effects: Any, results: Any, devices: Any) -> None:
    """Take a launch's output tokens out of ``results`` (first) and make them current."""
    token_bufs = results.consume_with_handlers([lambda xs: xs] * len(effects), strict=False)
    runtime_token = results.consume_token()
    for i, device in enumerate(devices):
        _dispatch.runtime_tokens.set_output_runtime_token(device, runtime_token.get_token(i))
    for effect, bufs in zip(effects, token_bufs, strict=True):
        if len(bufs) == 1:
            token = bufs[0]
        else:
            owners = [next(iter(b.sharding.device_set)) for b in bufs]
            sharding = _NamedSharding(_Mesh(owners, "x"), _P("x"))
            token = _array.make_array_from_single_device_arrays((0,), sharding, bufs)
        _dispatch.runtime_tokens.set_token_result(effect, _core.Token(token))


def results_handler(avals: Any, shardings: Any, committed: bool = True) -> Any:
    """Turns an executable's per-device output buffers into jax.Arrays (committed or not)."""
    return _pxla.global_avals_to_results_handler(avals, shardings, committed=committed)


def manual_scoped_op_sharding(mesh: Any, spec: Any, manual_axes: Any, ndim: int) -> Any:
    """The OpSharding of ``spec`` inside a manual region over ``manual_axes`` of ``mesh``.

    Why jax's: inside a region already manual over some axes, a sharding over the
    others carries manual subgroups, which only jax's NamedSharding -> HloSharding
    conversion (over a mesh whose manual axes are typed Manual) writes.
    """
    typed = mesh.abstract_mesh.update_axis_types(
        {a: _mesh_lib.AxisType.Manual for a in manual_axes}
    )
    return _NamedSharding(typed, spec)._to_xla_hlo_sharding(ndim).to_proto()


def hlo_computation(module: Any) -> Any:
    """The XlaComputation (HLO) of a StableHLO module, as jax's ``compiler_ir("hlo")``."""
    return _jax.mlir.mlir_module_to_xla_computation(
        _mlir.module_to_bytecode(module), use_tuple_args=False
    )


def hlo_text(module: Any, debug_info: bool) -> str:
    """The HLO text of a StableHLO module, printed as jax's ``Lowered.as_text("hlo")`` prints it."""
    print_opts = _hlo.HloPrintOptions.short_parsable()
    print_opts.print_metadata = debug_info
    return hlo_computation(module).as_hlo_module().to_string(print_opts)


def hlo_sharding_of(sharding: Any, ndim: int) -> Any:
    """The HloSharding a jax Sharding lays an ``ndim`` array out with."""
    return sharding._to_xla_hlo_sharding(ndim)


def device_assignment_of(sharding: Any) -> tuple[Any, ...]:
    """The devices a jax Sharding's HloSharding positions refer to, in order."""
    return tuple(sharding._device_assignment)


def default_device() -> Any:
    """The device uncommitted values land on (``jax.default_device`` or the first device)."""
    return _pxla.get_default_device()


def pytree_differences(new: Any, old: Any) -> list[tuple[Any, Any, Any, str]]:
    """Where two pytree structures differ: ``(path, new node, old node, explanation)``,
    as jax's compiled functions describe a call with another tree."""
    return list(_tree_util.equality_errors_pytreedef(new, old))


def at_top_level() -> bool:
    """True when no jax transformation or trace is active (eager evaluation)."""
    return _core.trace_state_clean()


# --- jaxlib's C++ jit dispatcher, driven by our executables ---


def cpp_dispatch_cache(capacity: int) -> Any:
    """A bounded cache for :func:`cpp_dispatcher` (``.clear()`` empties it)."""
    return _jax.PjitFunctionCache(capacity=capacity)


def cpp_dispatcher(
    name: str,
    fun: Any,
    cache_miss: Any,
    static_argnums: Any,
    static_argnames: Any,
    key: Any,
    cache: Any,
) -> Any:
    """A C++ callable that runs cached executables itself and calls ``cache_miss`` otherwise.

    ``cache_miss(*args, **kwargs)`` returns ``(outputs, fastpath_data | None, False)``.
    Each dispatcher gets its own cache, so dropping it frees its entries.
    """
    return _jax.pjit(
        name,
        fun,
        cache_miss,
        list(static_argnums),
        list(static_argnames),
        key,
        _tree_util.dispatch_registry,
        _pxla.cc_shard_arg,
        cache,
    )


def fastpath_data(
    executable: Any,
    out_tree: Any,
    in_shardings: Any,
    out_shardings: Any,
    out_avals: Any,
    committed: bool = True,
    kept: Sequence[bool] | None = None,
) -> Any:
    """What the C++ dispatcher needs to run ``executable`` without Python.

    ``in_shardings``: of the inputs the executable takes; ``kept``: one flag per
    argument of the call, whether the executable takes it (all, if None).
    """
    n = len(in_shardings)
    return _pxla.MeshExecutableFastpathData(
        executable,
        out_tree,
        list(in_shardings),
        list(out_shardings),
        list(out_avals),
        [committed] * len(out_avals),
        [True] * n if kept is None else list(kept),
        [None] * n,
        [],
    )


def dispatch_flatten(tree: Any) -> tuple[list[Any], Any]:
    """Flatten with the registry jaxlib's C++ dispatcher uses for outputs."""
    return _tree_util.dispatch_registry.flatten(tree, None)


# --- host callbacks (partitioner.host_callback) ---


def emit_python_callback(
    ctx: Any,
    callback: Callable[..., Any],
    token: Any,
    operands: list[Any],
    operand_avals: list[Any],
    result_avals: list[Any],
    *,
    has_side_effect: bool,
    partitioned: bool = False,
    sharding: Any = None,
) -> tuple[Any, Any, Any]:
    """jax's host-callback custom call: ``(results, token out, callback object)``.

    ``partitioned``: one call per device with its shard; otherwise one call with
    the global value where ``sharding`` puts it (MAXIMAL) or on every replica.
    """
    return _callback.emit_python_callback(
        ctx,
        callback,
        token,
        operands,
        operand_avals,
        result_avals,
        has_side_effect=has_side_effect,
        returns_token=True,
        partitioned=partitioned,
        sharding=sharding,
    )


def requires_devices_during_lowering(primitive: Any) -> None:
    """Make ``jax.jit`` pass its device assignment to lowerings of programs using ``primitive``."""
    _dispatch.prim_requires_devices_during_lowering.add(primitive)


# --- multi-process jobs (partitioner.distributed) ---


def distributed_client() -> Any:
    """The coordination-service client ``jax.distributed.initialize`` connected (key-value store)."""
    return _distributed.global_state.client


# --- host callbacks: checkpoint policies, the while loop ---


def gives_no_layout(eqn: Any) -> bool:
    """Whether a ``jax.jit`` call equation gives its operands and results no sharding or
    layout and donates nothing (inlining its body then changes nothing XLA is told)."""
    given = (*eqn.params["in_shardings"], *eqn.params["out_shardings"])
    layouts = (*eqn.params["in_layouts"], *eqn.params["out_layouts"])
    unspecified = _sharding_impls.UnspecifiedValue
    free = all(isinstance(s, unspecified) for s in given) and all(x is None for x in layouts)
    return free and not any(eqn.params["donated_invars"])


def remat_policy(decision: Any) -> str:
    """A checkpoint policy's decision for one equation: ``"save"``, ``"recompute"``, ``"offload"``."""
    case = _pe.ensure_enum(decision)
    if isinstance(case, _pe.SaveableType):
        return "save"
    if isinstance(case, _pe.Offloadable):
        return "offload"
    return "recompute"


def registered_lowering(primitive: Any) -> Callable[..., Any]:
    """The platform-independent MLIR lowering rule jax registered for ``primitive``."""
    return _mlir._lowerings[primitive].rule


def eval_closed_jaxpr(closed: Any, *args: Any) -> list[Any]:
    """Evaluate (or trace) a ClosedJaxpr on ``args``."""
    return _core.eval_jaxpr(closed.jaxpr, closed.consts, *args)


def partition_index() -> Any:
    """This device's index in the program's devices, an int32 scalar (fully manual regions).

    What jax's ``axis_index`` lowering computes its indices from; a device's
    position in a mesh whose devices are the program's, in order.
    """
    i32 = _ir.RankedTensorType.get([], _ir.IntegerType.get_signless(32))
    return _stablehlo.convert(i32, _stablehlo.partition_id())


def manual_callback_sharding(avals_out: Any) -> Any:
    """The sharding of a host callback each device of a fully manual region runs."""
    if jax_uses_shardy():
        return _callback._get_sdy_array_list_for_callbacks(avals_out)
    sharding = _xla_client.OpSharding()
    sharding.type = _xla_client.OpSharding.Type.MANUAL
    return sharding


# --- jax's compilation machinery (persistent cache, options, logs, monitoring) ---

# ``compiler.compile_or_get_cached``: compile, or load from the persistent
# compilation cache (``jax_compilation_cache_dir`` and its companion settings).
compile_or_get_cached = _compiler.compile_or_get_cached
# jax's CompileOptions from its flags (optimization effort and levels, remat,
# the XLA caches the persistent cache turns on) plus ``compiler_options``.
get_compile_options = _compiler.get_compile_options
# The compile call itself (jax's XLA error handlers included), for when no cache is in play.
backend_compile_and_load = _compiler.backend_compile_and_load
dump_module_to_file = _mlir.dump_module_to_file


#: Trace-context entries that say where a call is made (the ambient mesh, the axis
#: environment) or what partitioner keys on itself (the partitioner choice, taken
#: from the program): left out of :func:`lowering_settings`.
_CALL_SITE_CONTEXT = frozenset(
    {
        "mesh_context_manager",
        "abstract_mesh_context_manager",
        "axis_env_state",
        "jax_use_shardy_partitioner",
    }
)
_lowering_entries = _operator.itemgetter(
    *(i for i, name in enumerate(_config.trace_context_names()) if name not in _CALL_SITE_CONTEXT)
)


def lowering_settings() -> tuple[Any, ...]:
    """The jax settings a jaxpr is lowered under (``jax_default_matmul_precision``, x64,
    the threefry implementation, ...), for the executable cache's key.

    jax.jit's own compile caches key on its whole trace context (they are jax's
    ``weakref_lru_cache``s); this is that context less the entries that name where a
    call is made, which the program's own mesh already says.
    """
    return _lowering_entries(_config.trace_context())


#: The names of the :func:`compile_settings` entries, in order (for cache-miss explanations).
COMPILE_SETTING_NAMES = (
    "jax_exec_time_optimization_effort",
    "jax_memory_fitting_effort",
    "jax_optimization_level",
    "jax_memory_fitting_level",
    "jax_compiler_enable_remat_pass",
    "jax_disable_most_optimizations",
)


def compile_settings() -> tuple[Any, ...]:
    """The jax settings ``compiler.get_compile_options`` builds a program's XLA options
    from (optimization effort and levels, memory fitting, remat, jax's
    ``jax_disable_most_optimizations``), for the executable cache's key.

    jax.jit keys its persistent cache on them (the serialized options) but not its
    in-memory one, so changing ``jax_optimization_level`` mid-process keeps serving
    the program compiled before; partitioner compiles again.
    """
    return (
        _config.exec_time_optimization_effort.value,
        _config.memory_fitting_effort.value,
        _config.optimization_level.value,
        _config.memory_fitting_level.value,
        _config.enable_remat_opt_pass.value,
        _compiler._DISABLE_MOST_OPTIMIZATIONS.value,
    )


def persistent_cache_in_play() -> bool:
    """Whether ``compile_or_get_cached`` would read, write or share anything.

    With no cache directory (and no binary sharing between hosts), jax still
    hashes the module into a cache key on every compile, then finds no cache:
    skipping that keeps a cold compile as lean as before the cache was wired in.
    """
    return bool(
        _compilation_cache.is_persistent_cache_enabled() or _config.share_binary_between_hosts.value
    )


use_detailed_logging = _compiler.use_detailed_logging
# Logs at WARNING under ``jax_log_compiles`` and records a ``jax.monitoring``
# duration under ``event``: tools that profile jax.jit's compile time see ours.
log_elapsed_time = _dispatch.log_elapsed_time
JAXPR_TRACE_EVENT = _dispatch.JAXPR_TRACE_EVENT
JAXPR_TO_MLIR_MODULE_EVENT = _dispatch.JAXPR_TO_MLIR_MODULE_EVENT
BACKEND_COMPILE_EVENT = _dispatch.BACKEND_COMPILE_EVENT
log_compiles = _config.log_compiles
explain_cache_misses = _config.explain_cache_misses
hlo_module_cost_analysis = _jax.hlo_module_cost_analysis
using_pjrt_c_api = _xla_bridge.using_pjrt_c_api
module_to_string = _mlir.module_to_string


def user_call_site() -> str:
    """The user's ``file:line (function)`` the current call came from (our frames skipped)."""
    return _source_info_util.summarize(_source_info_util.current())


# --- memory kinds (NOTE [memory kinds] in lower/memory.py) ---

mem_space_to_kind = _core.mem_space_to_kind
mem_kind_to_space = _core.mem_kind_to_space
MemorySpace = _core.MemorySpace
device_put_p = _dispatch.device_put_p
subjaxprs = _core.subjaxprs


def array_layout(x: Any) -> Any:
    """An array's PjRt layout (cheap, hashable; None for typed key arrays).

    It keys the Python dispatch cache, so an argument in another memory layout
    never reuses an executable built for the default one (jaxlib's C++
    dispatcher misses on it the same way).
    """
    return getattr(x, "_pjrt_layout", None)
