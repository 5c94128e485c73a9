"""Every private jax entry point partitioner uses, behind one gateway.

Why: ``jax._src`` moves between releases. Keeping each use behind a name or a
small function here means a jax upgrade touches one package, and fails at import,
here, when a name is gone. Nothing outside this package imports from ``jax._src``.

The gateway exports *names*, never modules. The one block of named exports below
binds every public name once: jax's objects (``ClosedJaxpr = _core.ClosedJaxpr``)
grouped by the jax module they come from, bound to private names (``_core``), then
the small functions written where a use needs more than a name, grouped by the
module of this package that holds them:

- ``version.py``: the jax releases supported, checked before anything below is read;
- ``settings.py``: jax's flags partitioner reads or sets, and what its caches key on;
- ``mesh.py``: the ambient mesh, shared with ``with Mesh`` and ``jax.set_mesh``;
- ``tracing.py``: values as traced, the trace state, jaxprs, jit inlining, remat policies;
- ``values.py``: typed PRNG keys' physical arrays, a sharding's HloSharding, layouts;
- ``lowering.py``: jax's lowering rules, StableHLO -> HLO, host callbacks;
- ``runtime.py``: jaxlib's C++ dispatcher, results, ordered effects' tokens, the
  multi-process client;
- ``patches.py``: the two process-wide patches of jax, applied only where
  ``registry.py`` calls them.

Elsewhere, code reads ``jp.ClosedJaxpr`` and ``jp.push_mesh``, never
``jp.core.ClosedJaxpr`` nor ``jp.mesh.push_mesh`` (tests/test_architecture.py checks both).
"""

from __future__ import annotations

# The version check runs before the imports below read a single private name, so an
# unsupported jax fails with what to install, not an AttributeError.
# ruff: noqa: E402
import jax as _jax_pkg

from . import version as _version

_version.check_jax_version(_jax_pkg.__version__)

from jax._src import ad_checkpoint as _ad_checkpoint
from jax._src import api_util as _api_util
from jax._src import compiler as _compiler
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src import linear_util as _lu
from jax._src import mesh as _mesh_lib
from jax._src import named_sharding as _named_sharding
from jax._src import sharding as _sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe
from jax._src.interpreters import pxla as _pxla
from jax._src.lax.control_flow import loops as _loops
from jax._src.lib import _jax
from jax._src.lib import xla_client as _xla_client
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import sdy as _sdy

from . import lowering as _lowering
from . import mesh as _mesh
from . import patches as _patches
from . import runtime as _runtime
from . import settings as _settings
from . import tracing as _tracing
from . import values as _values

# --- named exports: every public name of the gateway, one line each ---
# Grouped by module, names sorted in each group: jax's modules sorted, then this
# package's in pipeline order. Elsewhere use `jp.Name`, never a module's attribute:
# tests/test_architecture.py fails on a module exported here.

# jax._src.ad_checkpoint
# What a function saves for its backward pass (the pipeline prices a step's residuals).
saved_residuals = _ad_checkpoint.saved_residuals

# jax._src.api_util
debug_info = _api_util.debug_info

# jax._src.compiler
# The compile call itself (jax's XLA error handlers included), for when no cache is in play.
backend_compile_and_load = _compiler.backend_compile_and_load
# Compile, or load from the persistent compilation cache (``jax_compilation_cache_dir``).
compile_or_get_cached = _compiler.compile_or_get_cached
# jax's CompileOptions from its flags (optimization effort and levels, remat, the XLA
# caches the persistent cache turns on) plus ``compiler_options``.
get_compile_options = _compiler.get_compile_options
use_detailed_logging = _compiler.use_detailed_logging

# jax._src.config
explain_cache_misses = _config.explain_cache_misses
log_compiles = _config.log_compiles

# jax._src.core
ClosedJaxpr = _core.ClosedJaxpr
DropVar = _core.DropVar
eqn_effects = _core.eqn_effects
eval_jaxpr = _core.eval_jaxpr
extend_axis_env_nd = _core.extend_axis_env_nd
Jaxpr = _core.Jaxpr
jaxprs_in_params = _core.jaxprs_in_params
Literal = _core.Literal
# Memory kinds of values (NOTE [memory kinds] in lower/memory.py), these three:
mem_kind_to_space = _core.mem_kind_to_space
mem_space_to_kind = _core.mem_space_to_kind
MemorySpace = _core.MemorySpace
new_jaxpr_eqn = _core.new_jaxpr_eqn
positional_effects = _core.positional_effects
pp_eqn_rules = _core.pp_eqn_rules
Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
subjaxprs = _core.subjaxprs
Tracer = _core.Tracer
typeof = _core.typeof
Var = _core.Var

# jax._src.dispatch
BACKEND_COMPILE_EVENT = _dispatch.BACKEND_COMPILE_EVENT
device_put_p = _dispatch.device_put_p
JAXPR_TO_MLIR_MODULE_EVENT = _dispatch.JAXPR_TO_MLIR_MODULE_EVENT
JAXPR_TRACE_EVENT = _dispatch.JAXPR_TRACE_EVENT
# Logs at WARNING under ``jax_log_compiles`` and records a ``jax.monitoring`` duration
# under ``event``: tools that profile jax.jit's compile time see ours.
log_elapsed_time = _dispatch.log_elapsed_time

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
dump_module_to_file = _mlir.dump_module_to_file
iota = _mlir.iota
ir_constants = _mlir.ir_constants
ir_tree_registry = _mlir.ir_tree_registry
jaxpr_subcomp = _mlir.jaxpr_subcomp
lower_fun = _mlir.lower_fun
lower_jaxpr_to_module = _mlir.lower_jaxpr_to_module
LoweringParameters = _mlir.LoweringParameters
module_to_string = _mlir.module_to_string
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

# jax._src.mesh
# Context managers setting the abstract mesh jax's sharding rules read (with
# ``use_concrete_mesh`` below, what jax's pjit sets while tracing over Explicit axes).
get_abstract_mesh = _mesh_lib.get_abstract_mesh
use_abstract_mesh = _mesh_lib.use_abstract_mesh

# jax._src.named_sharding
DuplicateSpecError = _named_sharding.DuplicateSpecError

# jax._src.sharding
IndivisibleError = _sharding.IndivisibleError

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
using_pjrt_c_api = _xla_bridge.using_pjrt_c_api

# jaxlib._jax
DeviceList = _jax.DeviceList
hlo_module_cost_analysis = _jax.hlo_module_cost_analysis

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
# so a jax upgrade that renames one fails at import, in this package.
jaxpr_forwarding = _pe._jaxpr_forwarding  # per output: the input it forwards, or None
use_concrete_mesh = _sharding_impls._internal_use_concrete_mesh  # context manager

# .version
check_jax_version = _version.check_jax_version
SUPPORTED_JAX = _version.SUPPORTED_JAX

# .settings
COMPILE_SETTING_NAMES = _settings.COMPILE_SETTING_NAMES
compile_settings = _settings.compile_settings
jax_uses_shardy = _settings.jax_uses_shardy
lowering_settings = _settings.lowering_settings
no_execution = _settings.no_execution
no_tracing = _settings.no_tracing
persistent_cache_in_play = _settings.persistent_cache_in_play
shardy_config = _settings.shardy_config
trace_context = _settings.trace_context
trace_context_names = _settings.trace_context_names

# .mesh
ambient_mesh = _mesh.ambient_mesh
context_meshes = _mesh.context_meshes
legacy_mesh_active = _mesh.legacy_mesh_active
pop_mesh = _mesh.pop_mesh
push_mesh = _mesh.push_mesh

# .tracing
at_top_level = _tracing.at_top_level
body_shardings = _tracing.body_shardings
eval_closed_jaxpr = _tracing.eval_closed_jaxpr
gives_no_layout = _tracing.gives_no_layout
is_token = _tracing.is_token
pp_eqn = _tracing.pp_eqn
pytree_differences = _tracing.pytree_differences
remat_policy = _tracing.remat_policy
shaped_abstractify = _tracing.shaped_abstractify
typed_abstractify = _tracing.typed_abstractify
user_call_site = _tracing.user_call_site

# .values
array_layout = _values.array_layout
default_device = _values.default_device
device_assignment_of = _values.device_assignment_of
hlo_sharding_of = _values.hlo_sharding_of
is_extended = _values.is_extended
key_impl = _values.key_impl
manual_scoped_op_sharding = _values.manual_scoped_op_sharding
physical_array = _values.physical_array
physical_aval = _values.physical_aval
physical_sharding = _values.physical_sharding

# .lowering
emit_python_callback = _lowering.emit_python_callback
hlo_computation = _lowering.hlo_computation
hlo_text = _lowering.hlo_text
manual_callback_sharding = _lowering.manual_callback_sharding
partition_index = _lowering.partition_index
registered_lowering = _lowering.registered_lowering
requires_devices_during_lowering = _lowering.requires_devices_during_lowering

# .runtime
cpp_dispatch_cache = _runtime.cpp_dispatch_cache
cpp_dispatcher = _runtime.cpp_dispatcher
dispatch_flatten = _runtime.dispatch_flatten
distributed_client = _runtime.distributed_client
fastpath_data = _runtime.fastpath_data
record_tokens = _runtime.record_tokens
results_handler = _runtime.results_handler
token_inputs = _runtime.token_inputs

# .patches (process-wide: only registry.py calls the two installers)
canonicalize_collective_axes = _patches.canonicalize_collective_axes
check_intermediate_shardings_hook = _patches.check_intermediate_shardings_hook
report_intermediate_shardings = _patches.report_intermediate_shardings
# --- end of named exports ---
