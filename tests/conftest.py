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
