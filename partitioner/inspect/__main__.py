"""``python -m partitioner.inspect``: the partitioning report from a shell.

    python -m partitioner.inspect mymodel:step --mesh data=4,model=2 \\
        --arg f32[32,16] --in "P('data')" --arg f32[16,8] --in "P(None, 'model')"

The function is imported from ``module:function`` and pjit-ed with the given
specs (a function that is already pjit- or pmap-ed is used as it is), lowered for
``jax.ShapeDtypeStruct`` arguments (nothing is allocated or run) and compiled;
the report is printed (``--json`` for JSON, ``--compare`` for GSPMD vs Shardy).
A spec may be ``AUTO``: partitioner chooses it, and the report shows the choice.

Devices are the backend's. On a CPU (``JAX_PLATFORMS`` unset or naming ``cpu``) the
command makes jax create as many as ``--mesh`` needs, before anything creates them: the
module named is imported after, so it may build arrays when imported. A count the
environment asks for (``XLA_FLAGS=--xla_force_host_platform_device_count=N``,
``JAX_NUM_CPU_DEVICES``) stands when it is enough, and is raised when it is not.

Why here, in the public package, and not beside the tables in ``_src/inspect/``:
the shell pjits the function it is given, so it sits above the front doors,
while the tables sit below the AOT stages that build them.
"""

from __future__ import annotations

import argparse
import importlib
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from .._src import options
from .._src.cpu_devices import requested_cpu_device_count, set_cpu_device_count
from .._src.inspect.api import compare_partitioners, report
from .._src.pjit import pjit
from .._src.sharding.auto import AUTO
from .._src.sharding.mesh_env import mesh as mesh_context

_DTYPES = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u32": "uint32", "bool": "bool", "pred": "bool",
}  # fmt: skip


def parse_arg(text: str) -> jax.ShapeDtypeStruct:
    """``f32[32,16]`` (or ``float32[32, 16]``, ``f32[]``) as a ShapeDtypeStruct.

    Raises:
        ValueError: another spelling.
    """
    match = re.fullmatch(r"\s*([a-z0-9]+)\[([0-9,\s]*)\]\s*", text)
    if not match:
        raise ValueError(f"--arg {text!r}: expected dtype[dims], e.g. f32[32,16]")
    dtype = _DTYPES.get(match.group(1), match.group(1))
    dims = tuple(int(d) for d in match.group(2).replace(" ", "").split(",") if d)
    try:
        return jax.ShapeDtypeStruct(dims, jax.numpy.dtype(dtype))
    except TypeError:
        raise ValueError(f"--arg {text!r}: unknown dtype {match.group(1)!r}") from None


def parse_spec(text: str) -> PartitionSpec | None | Any:
    """``P('data')``, ``P(None, 'model')``, ``PartitionSpec(('a', 'b'))``, ``None`` or
    ``AUTO`` (partitioner chooses; the report then has its auto table).

    Raises:
        ValueError: anything else.
    """
    if text.strip() == "None":
        return None
    if text.strip() == "AUTO":
        return AUTO
    match = re.fullmatch(r"\s*(?:P|PartitionSpec)\((.*)\)\s*", text)
    if not match:
        raise ValueError(f"spec {text!r}: expected P(...) with axis names, None or tuples")
    entries: list[Any] = []
    for entry in re.findall(r"\([^)]*\)|[^,]+", match.group(1)):
        entry = entry.strip()
        if not entry:
            continue
        names = re.findall(r"'([^']*)'|\"([^\"]*)\"", entry)
        if entry == "None":
            entries.append(None)
        elif entry.startswith("("):
            entries.append(tuple(a or b for a, b in names))
        elif len(names) == 1:
            entries.append(names[0][0] or names[0][1])
        else:
            raise ValueError(f"spec {text!r}: cannot read entry {entry!r}")
    return PartitionSpec(*entries)


def parse_mesh(text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``data=4,model=2`` as axis names and sizes (text only: jax creates no devices).

    Raises:
        ValueError: another spelling.
    """
    axes = []
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"--mesh {text!r}: expected name=size,... e.g. data=4,model=2")
        axes.append((name.strip(), int(size)))
    return tuple(n for n, _ in axes), tuple(s for _, s in axes)


def _provide_devices(n: int) -> str:
    """On a CPU, make jax create at least the ``n`` devices a mesh needs, before anything
    creates them (the pytest plugin's helper, so both set the count the same way). A
    count the environment asks for stands when it is enough (a module may build a mesh
    of its own when imported); an accelerator's devices are what they are.

    Returns:
        Why a CPU backend may have fewer than ``n`` devices after all: the hint for
        the error ``_check_devices`` raises then.
    """
    platforms = jax.config.values["jax_platforms"] or ""
    if platforms and "cpu" not in platforms.split(","):
        return f"JAX_PLATFORMS={platforms} names no cpu"
    asked = requested_cpu_device_count()
    if (asked is None or asked < n) and set_cpu_device_count(n, run_on_cpu=False) is not None:
        return "jax created its devices before the command could set the count"
    return (
        f"jax was to create {n} or more CPU devices, but the module imported set another "
        "count (jax_num_cpu_devices) before creating them"
    )


def _check_devices(text: str, n: int, cpu_hint: str) -> None:
    """Refuse a mesh needing more devices than the backend has, naming why.

    Raises:
        ValueError: fewer than ``n`` devices.
    """
    have, platform = jax.device_count(), jax.default_backend()
    if n > have:
        why = cpu_hint if platform == "cpu" else f"{platform}: the command sets CPU counts only"
        raise ValueError(f"--mesh {text!r} needs {n} devices, the backend has {have} ({why})")


def _target(text: str) -> Any:
    module_name, _, attr = text.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{text!r}: expected module:function")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m partitioner.inspect", description=__doc__.splitlines()[0]
    )
    parser.add_argument("target", help="module:function to report on")
    parser.add_argument("--mesh", required=True, help="axis sizes, e.g. data=4,model=2")
    parser.add_argument("--arg", action="append", default=[], help="an argument, e.g. f32[32,16]")
    parser.add_argument("--in", dest="ins", action="append", default=[], help="its spec")
    parser.add_argument("--out", default="None", help="the output spec (default: replicated)")
    parser.add_argument("--partitioner", choices=("gspmd", "shardy"), default=None)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--compare", action="store_true", help="GSPMD vs Shardy side by side")
    args = parser.parse_args(argv)
    try:
        names, sizes = parse_mesh(args.mesh)
        hint = _provide_devices(math.prod(sizes))  # before anything creates jax's devices
        structs = [parse_arg(a) for a in args.arg]
        if args.ins and len(args.ins) not in (1, len(structs)):
            raise ValueError(f"give one --in per --arg ({len(structs)}), or one for all")
        specs = [parse_spec(s) for s in args.ins] or [None]
        in_specs = tuple(specs * len(structs) if len(specs) == 1 else specs)
        fun = _target(args.target)
        f = (
            fun
            if callable(getattr(fun, "lower", None))
            else pjit(fun, in_specs, parse_spec(args.out))
        )
        _check_devices(args.mesh, math.prod(sizes), hint)
    except (ValueError, ImportError, AttributeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    devices = np.array(jax.devices()[: math.prod(sizes)]).reshape(sizes)
    with mesh_context(devices, names), options.spmd_partitioner(args.partitioner):
        if args.compare:
            print(compare_partitioners(f, *structs))
        else:
            result = report(f, *structs)
            print(result.to_json() if args.json else result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
