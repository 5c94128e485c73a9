"""Test set-up: the suite's fixtures, XLA's collective timeouts and hypothesis profiles.

The 8 virtual CPU devices come from partitioner's own pytest plugin
(``partitioner.testing.plugin``, loaded through its ``pytest11`` entry point):
``virtual_devices = 8`` in pyproject.toml's ``[tool.pytest.ini_options]``. The
plugin sets them before this file is imported, so nothing imported here can leave
jax with one device; this suite is the plugin's first user.
"""

import os
from collections.abc import Iterator

import pytest

# Appended after the plugin wrote XLA_FLAGS: jax reads them when it creates its backends,
# at the first test that needs a device, so they still take effect (and processes the
# tests start inherit them). A regression that hangs XLA's CPU collective rendezvous
# aborts instead of hanging CI. The machine code is compiled without LLVM's
# optimizations (a third of the suite's time went to them): the tests check values,
# shardings, HLO and XLA's memory and collective figures, which XLA's HLO passes decide
# before LLVM runs, and jax.jit, the reference, compiles under the same flags. For the
# same reason the fusions are emitted by XLA's CPU emitters of before its MLIR fusion
# emitters (the fusions themselves are chosen by HLO passes before either runs; XLA's
# memory, collective and flop figures were identical on the programs compared): they
# emit a small program's machine code in half the time (63 to 28 ms a compile, median of
# 30 sharded train steps over 8 devices), and the suite's time is mostly XLA compiling.
# The benchmarks and the documentation's pages (tests/docs) compile as users do.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_collective_timeout_seconds=60 --xla_cpu_collective_call_terminate_timeout_seconds=90"
    + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
).strip()

import jax  # noqa: E402

# Property tests run a few hundred examples each (spec parsing and every sharding round
# trip); no per-example deadline, because the first example of a new mesh shape pays for
# jax's cold caches. HYPOTHESIS_PROFILE=dev gives a quicker local loop.
from hypothesis import settings  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import partitioner  # noqa: E402
from partitioner.testing.plugin import MeshFactory  # noqa: E402

# Under CI (CI=true) the examples are derandomized, so a landing is never decided by a
# lucky draw; local runs keep exploring new examples every time.
settings.register_profile(
    "ci", max_examples=300, deadline=None, derandomize=bool(os.environ.get("CI"))
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MSG_NO_PLUGIN = """\
partitioner's pytest plugin is not loaded, so this suite would run on one device. It is \
loaded through the pytest11 entry point of an installed partitioner: pip install -e \
".[test]" (or name it: python -m pytest -p _partitioner_pytest)."""


def pytest_configure(config: pytest.Config) -> None:
    """Stop at once, with the fix, when the plugin that gives the suite its devices is missing."""
    plugins = config.pluginmanager
    named = ("partitioner", "_partitioner_pytest", "partitioner.testing.plugin")
    if not any(plugins.has_plugin(name) for name in named):
        raise pytest.UsageError(MSG_NO_PLUGIN)


# --- meshes: the plugin's ``mesh`` factory, for the mesh many modules share ---


@pytest.fixture
def mesh_4x2(mesh: MeshFactory) -> Mesh:
    """The 8 devices as a 4x2 ``("data", "model")`` mesh (Auto axes), as training runs over."""
    return mesh((4, 2), ("data", "model"))


@pytest.fixture
def in_mesh_4x2(mesh_4x2: Mesh) -> Iterator[Mesh]:
    """``mesh_4x2`` in context (``partitioner.mesh``, the classic mesh context pjit reads)."""
    with partitioner.mesh(mesh_4x2.devices, mesh_4x2.axis_names) as in_context:
        yield in_context


# --- front doors: which SPMD partitioner ---


@pytest.fixture(params=["gspmd", "shardy"])
def partitioner_mode(request: pytest.FixtureRequest):
    """Run the test under each of XLA's SPMD partitioners (``partitioner.spmd_partitioner``)."""
    with partitioner.spmd_partitioner(request.param):
        yield request.param


@pytest.fixture(params=["gspmd", "shardy"])
def jax_partitioner_mode(request: pytest.FixtureRequest):
    """Like ``partitioner_mode``, and jax's ``jax_use_shardy_partitioner`` set alike.

    For tests where ``jax.jit`` builds the enclosing module (a pjit or a
    constraint inside ``jax.jit``): jax's flag picks that module's partitioner.
    """
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
    try:
        with partitioner.spmd_partitioner(request.param):
            yield request.param
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


# --- transformation rules ---


@pytest.fixture(params=["direct", "jvp+partial_eval"])
def linearize_mode(request: pytest.FixtureRequest):
    """Run under jax's direct linearize and, like ``JAX_USE_DIRECT_LINEARIZE=0``, without it.

    Without it, ``linearize``/``grad``/``vjp`` go through JVP + partial eval (our
    ``pe.custom_partial_eval_rules`` entry); with it, through the JVP rule and
    jax's linearize trace. The flag is restored afterwards.
    """
    old = jax.config.jax_use_direct_linearize
    jax.config.update("jax_use_direct_linearize", request.param == "direct")
    try:
        yield request.param
    finally:
        jax.config.update("jax_use_direct_linearize", old)
