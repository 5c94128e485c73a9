"""What jax and XLA see of a value: the physical arrays behind extended dtypes (typed
PRNG keys), a sharding's HloSharding and devices, an array's layout."""

from __future__ import annotations

from typing import Any

from jax._src import core as _core
from jax._src import dtypes as _dtypes
from jax._src import mesh as _mesh_lib
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import pxla as _pxla
from jax.sharding import NamedSharding as _NamedSharding

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


# --- shardings and layouts ---


def hlo_sharding_of(sharding: Any, ndim: int) -> Any:
    """The HloSharding a jax Sharding lays an ``ndim`` array out with."""
    return sharding._to_xla_hlo_sharding(ndim)


def device_assignment_of(sharding: Any) -> tuple[Any, ...]:
    """The devices a jax Sharding's HloSharding positions refer to, in order."""
    return tuple(sharding._device_assignment)


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


def default_device() -> Any:
    """The device uncommitted values land on (``jax.default_device`` or the first device)."""
    return _pxla.get_default_device()


def array_layout(x: Any) -> Any:
    """An array's PjRt layout (cheap, hashable; None for typed key arrays).

    It keys the Python dispatch cache, so an argument in another memory layout
    never reuses an executable built for the default one (jaxlib's C++
    dispatcher misses on it the same way).
    """
    return getattr(x, "_pjrt_layout", None)
