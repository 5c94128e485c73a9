"""Test set-up: 8 virtual CPU devices, configured before jax is imported."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
# A regression that hangs XLA's CPU collective rendezvous aborts instead of hanging CI.
os.environ["XLA_FLAGS"] += (
    " --xla_cpu_collective_timeout_seconds=60 --xla_cpu_collective_call_terminate_timeout_seconds=90"
)

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

# Property tests run a few hundred examples each (issue 2); no per-example deadline,
# because the first example of a new mesh shape pays for jax's cold caches.
# HYPOTHESIS_PROFILE=dev gives a quicker local loop.
from hypothesis import settings  # noqa: E402

# Under CI (CI=true) the examples are derandomized, so a landing is never decided by a
# lucky draw; local runs keep exploring new examples every time.
settings.register_profile(
    "ci", max_examples=300, deadline=None, derandomize=bool(os.environ.get("CI"))
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# --- pjit suite (issue 3) ---
import pytest  # noqa: E402

import partitioner  # noqa: E402


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


# --- transformation rules suite (issue 4) ---


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
