"""Which devices each piece of a call puts it on, and jax's error when two disagree.

Why one module: a call's devices can come from its arguments, the mesh in
context, its given in/out shardings or the shardings inside its body; when two
disagree, jax.jit raises "Received incompatible devices for jitted computation"
naming both, in one format, and code matches that sentence. Every place that
finds such a disagreement describes both sides here, so the sentence reads the
same whichever pair it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: What a context mesh is called in jax's message (``jit's context mesh``).
CONTEXT_MESH = "jit's context mesh"
INPUT_SHARDING = "explicit input sharding"
OUTPUT_SHARDING = "explicit output sharding"


@dataclass(frozen=True)
class DeviceSource:
    """The devices one piece of a call names, and what that piece is, as jax names it.

    Attributes:
        devices: in the piece's device order.
        what: ``"argument x of f with shape float32[8]"``, ``"jit's context mesh"``,
            ``"explicit output sharding"``, ``"sharding_constraint inside jit"``.
        at: where in the user's code (``" at f.py:3"``), or empty.
    """

    devices: tuple[Any, ...]
    what: str
    at: str = ""

    def describe(self) -> str:
        ids = [d.id for d in self.devices]
        platform = self.devices[0].platform.upper() if self.devices else "?"
        joint = " and" if self.what.startswith("argument ") else ""
        return f"{self.what}{joint} with device ids {ids} on platform {platform}{self.at}"


def argument_source(label: str, fun_name: str, x: Any, devices: Sequence[Any]) -> DeviceSource:
    """An argument as jax's message names it: its path, the function and its shape."""
    aval = getattr(x, "aval", None)
    shape = (
        aval.str_short()
        if aval is not None
        else f"{getattr(x, 'dtype', '?')}{list(getattr(x, 'shape', ()))}"
    )
    return DeviceSource(tuple(devices), f"argument {label} of {fun_name} with shape {shape}")


def incompatible_devices(api: str, first: DeviceSource, second: DeviceSource) -> ValueError:
    """jax.jit's "Received incompatible devices" error for two pieces of a call, then ours."""
    return ValueError(
        f"Received incompatible devices for jitted computation. Got {first.describe()} and "
        f"{second.describe()}\n({api}: a call runs on one set of devices; move them onto the "
        "same devices first, with jax.device_put(x, sharding).)"
    )
