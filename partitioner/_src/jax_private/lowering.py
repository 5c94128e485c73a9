"""Lowering: jax's lowering rules, StableHLO -> HLO, and host callbacks in a module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax._src import callback as _callback
from jax._src import dispatch as _dispatch
from jax._src.interpreters import mlir as _mlir
from jax._src.lib import _jax
from jax._src.lib import hlo as _hlo
from jax._src.lib import xla_client as _xla_client
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _stablehlo

from .settings import jax_uses_shardy

# --- modules and HLO ---


def registered_lowering(primitive: Any) -> Callable[..., Any]:
    """The platform-independent MLIR lowering rule jax registered for ``primitive``."""
    return _mlir._lowerings[primitive].rule


def partition_index() -> Any:
    """This device's index in the program's devices, an int32 scalar (fully manual regions).

    What jax's ``axis_index`` lowering computes its indices from; a device's
    position in a mesh whose devices are the program's, in order.
    """
    i32 = _ir.RankedTensorType.get([], _ir.IntegerType.get_signless(32))
    return _stablehlo.convert(i32, _stablehlo.partition_id())


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


def manual_callback_sharding(avals_out: Any) -> Any:
    """The sharding of a host callback each device of a fully manual region runs."""
    if jax_uses_shardy():
        return _callback._get_sdy_array_list_for_callbacks(avals_out)
    sharding = _xla_client.OpSharding()
    sharding.type = _xla_client.OpSharding.Type.MANUAL
    return sharding
