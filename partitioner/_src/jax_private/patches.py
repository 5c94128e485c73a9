"""The two process-wide patches of jax, installed only where ``registry.py`` calls them.

Each replaces a function of a jax module that jax reads through the module at call
time (so every caller in the process gets the wrapper), fails with an ImportError
naming the supported jax when the function it wraps is gone, and is a no-op when
installed twice. docs/architecture.md has a section on each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax as _jax_pkg
import numpy as _np
from jax._src import dispatch as _dispatch
from jax._src import stages as _stages
from jax._src import tree_util as _tree_util
from jax._src import util as _util
from jax._src.interpreters import pxla as _pxla
from jax._src.lax import parallel as _parallel

from .version import SUPPORTED_JAX

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
