"""Tracing a call and reading its jaxprs: values as traced, the trace state, where a
call comes from, evaluating and printing jaxprs, which jit calls inline and what a
checkpoint policy decides."""

from __future__ import annotations

import os as _os
from typing import Any

import jax as _jax_pkg
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import mesh as _mesh_lib
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src import tree_util as _tree_util
from jax._src.interpreters import partial_eval as _pe

# Source locations jax records for equations (and XLA keeps in op metadata) name the
# user's line, not partitioner's: jax skips its own files the same way.
_source_info_util.register_exclusion(_os.path.dirname(_os.path.dirname(__file__)))  # _src/

# --- values as traced ---


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


# --- the trace state and the call ---


def at_top_level() -> bool:
    """True when no jax transformation or trace is active (eager evaluation)."""
    return _core.trace_state_clean()


def user_call_site() -> str:
    """The user's ``file:line (function)`` the current call came from (our frames skipped)."""
    return _source_info_util.summarize(_source_info_util.current())


def pytree_differences(new: Any, old: Any) -> list[tuple[Any, Any, Any, str]]:
    """Where two pytree structures differ: ``(path, new node, old node, explanation)``,
    as jax's compiled functions describe a call with another tree."""
    return list(_tree_util.equality_errors_pytreedef(new, old))


# --- jaxprs: evaluating, printing, the shardings a body names ---


def eval_closed_jaxpr(closed: Any, *args: Any) -> list[Any]:
    """Evaluate (or trace) a ClosedJaxpr on ``args``."""
    return _core.eval_jaxpr(closed.jaxpr, closed.consts, *args)


def pp_eqn(eqn: Any, context: Any, settings: Any) -> Any:
    """jax's default pretty-printing of an equation (for a custom ``pp_eqn_rules`` entry)."""
    return _core._pp_eqn(eqn, context, settings)


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
        where = _source_info_util.summarize(info.source_info) if info.source_info else "?"
        found.append((sharding, info.eqn_name, where))
    return found


# --- jit inlining and checkpoint policies (remat) ---


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
