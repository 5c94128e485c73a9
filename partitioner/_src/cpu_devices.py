"""How many CPU devices jax creates, set before it creates them.

jax reads the count once, when it creates its backends (the first ``jax.devices()``,
array or compiled call); after that it cannot change in the process. Two callers set it
on the user's behalf, so that nobody has to export ``XLA_FLAGS`` first: the pytest
plugin (``--virtual-devices N``, from pytest's earliest hook) and ``python -m
partitioner.inspect`` (the devices its ``--mesh`` needs, before it imports the user's
module). One helper for both, so the two set the count the same way.

The plugin imports this module only when a run asks for devices: loading the plugin
imports neither jax nor partitioner.
"""

from __future__ import annotations

import os
import re

import jax

from . import jax_private as jp

#: The XLA flag giving the host platform's device count (read when the backend is made).
XLA_FLAG = "--xla_force_host_platform_device_count"


def set_cpu_device_count(n: int, *, run_on_cpu: bool) -> int | None:
    """Make jax create ``n`` CPU devices when it creates its backends.

    Sets ``XLA_FLAGS`` (so processes started from here inherit the count; an earlier
    count in it is replaced) and jax's ``jax_num_cpu_devices`` (which jax reads
    before the flag). With ``run_on_cpu``, the CPU also becomes jax's platform unless
    ``JAX_PLATFORMS`` names one: a test suite asking for virtual devices means to run
    on them, while a report on a GPU machine should stay on its GPUs.

    Returns:
        None when the count is set; when jax's backends exist already, nothing is
        changed and the number of CPU devices jax has is returned (the caller decides
        whether that many will do).
    """
    if jp.backends_are_initialized():
        return len(jax.devices("cpu"))
    flags = re.sub(rf"{XLA_FLAG}=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{XLA_FLAG}={n}"])
    jax.config.update("jax_num_cpu_devices", n)
    if run_on_cpu and not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    return None


def requested_cpu_device_count() -> int | None:
    """The CPU device count the process already asks jax for: ``jax_num_cpu_devices``
    (``JAX_NUM_CPU_DEVICES``, or set in code; jax reads it first), else the flag in
    ``XLA_FLAGS``; None when neither gives one."""
    configured = jax.config.values["jax_num_cpu_devices"]
    if configured >= 0:
        return int(configured)
    found = re.findall(rf"{XLA_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None
