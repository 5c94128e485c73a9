"""partitioner's pytest plugin: virtual CPU devices, a mesh fixture, a device-count marker.

pytest loads it by itself wherever partitioner is installed (the ``pytest11`` entry
point ``partitioner``); ``-p no:partitioner`` turns it off. Loaded, it only adds
names: the device count changes only when asked. It is a package of its own, beside
``partitioner`` rather than inside it, so that loading it imports neither jax nor
partitioner: every pytest run in an environment where partitioner is installed loads
it, and most never ask for it. jax is imported when a run asks for devices, a test
carries the marker, or the fixture is used. ``partitioner.testing.plugin`` is the same
plugin under the name users import.

- ``--virtual-devices N`` (or ``virtual_devices = N`` in the ini file; the option
  wins) runs the session on N virtual CPU devices. Every JAX project's
  ``conftest.py`` has to set ``--xla_force_host_platform_device_count`` before jax
  creates its devices, and a conftest that imports a module importing jax first
  silently gets one device. The plugin sets it from pytest's earliest hook for
  plugins, before any conftest is imported: ``XLA_FLAGS`` (so processes the tests
  start inherit it) and jax's ``jax_num_cpu_devices``, and it makes the CPU jax's
  platform unless ``JAX_PLATFORMS`` says otherwise. If jax's devices exist already
  (another plugin used jax), the count can no longer change and the run stops with
  a usage error saying so.
- ``mesh``: a fixture that builds meshes, ``mesh((4, 2), ("data", "model"))``, over
  the first devices (Auto axes unless ``axis_types=`` says otherwise), and skips the
  test when there are too few devices.
- ``@pytest.mark.needs_devices(n)``: skips a test when jax has fewer than ``n``
  devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported where used: loading the plugin imports no jax
    from jax.sharding import AxisType, Mesh

    from .axis_types import AxisTypes

OPTION = "--virtual-devices"
INI = "virtual_devices"

MSG_TOO_LATE = """\
{option} {n}: jax's devices were created before partitioner's pytest plugin could set \
the count (jax has {have} devices): something initialised jax's backends while pytest \
was starting, before any conftest (another plugin, or a -p module, that ran jax). Set \
the count before that code runs, or drop it from the plugins loaded first."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("partitioner", "partitioner (JAX device meshes)")
    group.addoption(
        OPTION,
        dest="virtual_devices",
        type=int,
        default=None,
        metavar="N",
        help="run on N virtual CPU devices (set before jax creates its devices)",
    )
    parser.addini(INI, "run on this many virtual CPU devices (as --virtual-devices)", default="")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Set the device count before the first conftest (and whatever it imports) runs."""
    n = _requested(early_config)
    if n is not None:
        _set_virtual_devices(n, OPTION)


def _requested(config: pytest.Config) -> int | None:
    """The device count asked for: the option, else the ini setting, else None."""
    n = config.known_args_namespace.virtual_devices
    where = OPTION
    if n is None:
        text = str(config.getini(INI)).strip()
        if not text:
            return None
        where = f"the ini setting {INI}"
        try:
            n = int(text)
        except ValueError:
            raise pytest.UsageError(f"{where} must be a whole number, got {text!r}") from None
    if n < 1:
        raise pytest.UsageError(f"{where} must be at least 1, got {n}")
    return n


def _set_virtual_devices(n: int, option: str = OPTION) -> None:
    """Make jax create ``n`` CPU devices, and run on the CPU unless JAX_PLATFORMS says otherwise.

    The helper is shared with ``python -m partitioner.inspect``, which sets the count
    its ``--mesh`` needs the same way.

    Raises:
        pytest.UsageError: jax's devices exist already, and not ``n`` of them.
    """
    from partitioner._src.cpu_devices import set_cpu_device_count

    have = set_cpu_device_count(n, run_on_cpu=True)
    if have is not None and have != n:
        raise pytest.UsageError(MSG_TOO_LATE.format(option=option, n=n, have=have))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs_devices(n): skip the test when jax has fewer than n devices"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("needs_devices")
    if marker is None:
        return
    import jax

    (n,) = marker.args
    have = jax.device_count()
    if have < n:
        pytest.skip(f"needs {n} devices, jax has {have} (run pytest with {OPTION} {n})")


MeshFactory = Callable[..., "Mesh"]


@pytest.fixture
def mesh() -> MeshFactory:
    """Build a mesh over the first devices: ``mesh((4, 2), ("data", "model"))``.

    Axes are Auto (as ``pjit`` expects) unless ``axis_types=`` gives one type for
    all or one per axis (``jax.sharding.AxisType`` values or their names, as everywhere
    in partitioner.testing); ``devices=`` picks others than ``jax.devices()``. The
    test is skipped when the mesh needs more devices than there are.
    """

    import jax
    from jax.sharding import AxisType

    def make(
        shape: Sequence[int],
        axis_names: Sequence[str],
        *,
        axis_types: AxisTypes = AxisType.Auto,
        devices: Sequence[Any] | None = None,
    ) -> Mesh:
        shape, names = tuple(shape), tuple(axis_names)
        if len(shape) != len(names):
            raise ValueError(f"mesh: shape {shape} and axis_names {names} differ in length")
        types = _per_axis(axis_types, names)
        pool = list(jax.devices() if devices is None else devices)
        n = math.prod(shape)
        if n > len(pool):
            pytest.skip(f"a {shape} mesh needs {n} devices, there are {len(pool)}")
        return jax.make_mesh(shape, names, axis_types=types, devices=pool[:n])

    return make


def _per_axis(axis_types: AxisTypes, names: tuple[str, ...]) -> tuple[AxisType, ...]:
    """One AxisType per axis of a mesh with axes ``names``: one type given is every axis's.

    Raises:
        TypeError, ValueError: ``axis_types`` is no axis type (the kit's one check), or
            a sequence of another length than the axes.
    """
    from jax.sharding import AxisType

    from .axis_types import normalize_axis_types

    types = normalize_axis_types(axis_types, "mesh")
    if isinstance(types, AxisType):
        return (types,) * len(names)
    if len(types) != len(names):
        raise ValueError(
            f"mesh: axis_types {axis_types!r} gives {len(types)} types for the {len(names)} "
            f"axes {names}: give one per axis, or one AxisType for all"
        )
    return types
