"""Differential testing of the transformation rules on random programs.

hypothesis draws small jax programs (elementwise unary/binary ops, dots,
reductions, transposes, reshapes, broadcasting, sharding constraints) over one
or two inputs whose dimensions divide the mesh, plus random valid in/out specs
on a 1-D (8) or 2-D (4x2) mesh. ``pjit`` of the program, ``jax.grad`` of the
sum of its outputs and ``jax.vmap`` of it must match the same program under
``jax.jit`` (with the constraints left out). The partitioner (GSPMD or Shardy)
is drawn per example, so both are covered.

Each example compiles several executables, so the properties run few examples
(``max_examples`` below overrides the conftest profile).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import partitioner
from partitioner import PartitionSpec as P
from partitioner import pjit, with_sharding_constraint
from tests.helpers import MESH_1D, MESH_2D, mesh_ctx
from tests.primitives.rules_helpers import assert_sharded_like, assert_tree_close

# among the slowest modules measured (--durations)
pytestmark = pytest.mark.slow

#: Relative tolerance, and absolute tolerance relative to the largest |value| of
#: the reference (at least 1): float32 sums and dots reassociate when sharded.
RTOL = 1e-4
ATOL_SCALE = 1e-4

EXAMPLES = 25
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MESHES = {"1d": MESH_1D, "2d": MESH_2D}
DIMS = {"1d": (8, 16), "2d": (4, 8)}

Shape = tuple[int, ...]

# --- the program representation ---

UNARY: dict[str, Callable[[Any], Any]] = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "half_square": lambda x: 0.5 * x * x,
    "affine": lambda x: 1.5 * x + 0.25,
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
}


@dataclass(frozen=True)
class Op:
    """``values.append(op(values[args[0]], ...))``; ``arg`` is op-specific (axis, shape, spec)."""

    kind: str
    name: str
    args: tuple[int, ...]
    arg: Any = None

    def __repr__(self) -> str:
        extra = "" if self.arg is None else f", {self.arg!r}"
        return f"Op({self.kind}:{self.name}{tuple(self.args)}{extra})"


@dataclass(frozen=True)
class Program:
    mesh: str
    in_shapes: tuple[Shape, ...]
    ops: tuple[Op, ...]
    outputs: tuple[int, ...]
    in_specs: tuple[Any, ...]
    out_specs: tuple[Any, ...]

    def used_inputs(self) -> list[bool]:
        """Whether some output depends on each input."""
        deps = [{i} for i in range(len(self.in_shapes))]
        for op in self.ops:
            deps.append(set().union(*(deps[a] for a in op.args)))
        reached = set().union(*(deps[i] for i in self.outputs))
        return [i in reached for i in range(len(self.in_shapes))]

    def fun(self, constrain: bool = True) -> Callable[..., Any]:
        """The program as a function of its inputs, returning a tuple of outputs."""

        def run(*xs: Any) -> tuple[Any, ...]:
            values = list(xs)
            for op in self.ops:
                values.append(_apply(op, values, constrain))
            return tuple(values[i] for i in self.outputs)

        return run


def _apply(op: Op, values: Sequence[Any], constrain: bool) -> Any:
    a = values[op.args[0]]
    if op.kind == "unary":
        return UNARY[op.name](a)
    if op.kind == "binary":
        return BINARY[op.name](a, values[op.args[1]])
    if op.kind == "dot":
        return jnp.dot(a, values[op.args[1]])
    if op.kind == "reduce":
        return (jnp.sum if op.name == "sum" else jnp.mean)(a, axis=op.arg)
    if op.kind == "transpose":
        return jnp.transpose(a, op.arg)
    if op.kind == "reshape":
        return jnp.reshape(a, op.arg)
    if op.kind == "broadcast":
        return jnp.broadcast_to(a[None], (op.arg, *a.shape))
    if op.kind == "constrain":
        return with_sharding_constraint(a, op.arg) if constrain else a
    raise AssertionError(op)


# --- strategies ---


def _axis_choices(mesh: str) -> list[tuple[str, ...]]:
    shape, names = MESHES[mesh]
    out = []
    for r in range(1, len(names) + 1):
        out.extend(itertools.permutations(names, r))
    return out


def _axis_size(mesh: str, axes: Sequence[str]) -> int:
    shape, names = MESHES[mesh]
    sizes = dict(zip(names, shape, strict=True))
    return math.prod(sizes[a] for a in axes)


@st.composite
def specs(draw: Any, mesh: str, shape: Shape, allow_unconstrained: bool = False) -> Any:
    """A valid spec for ``shape``: each dim unpartitioned, or over mesh axes whose product divides it."""
    if not shape and draw(st.booleans()):
        return None
    used: set[str] = set()
    entries: list[Any] = []
    for dim in shape:
        options: list[Any] = [None]
        if allow_unconstrained:
            options.append(P.UNCONSTRAINED)
        options += [
            axes if len(axes) > 1 else axes[0]
            for axes in _axis_choices(mesh)
            if not used & set(axes) and dim % _axis_size(mesh, axes) == 0
        ]
        entry = draw(st.sampled_from(options))
        if isinstance(entry, (str, tuple)):
            used.update((entry,) if isinstance(entry, str) else entry)
        entries.append(entry)
    n = draw(st.integers(0, len(entries)))  # trailing dims may be left out
    if all(e is None for e in entries[n:]):
        entries = entries[:n]
    return P(*entries)


def _candidates(
    shapes: Sequence[Shape], dims: Sequence[int]
) -> list[tuple[str, str, tuple[int, ...], Any]]:
    """Every op applicable to the current values, as (kind, name, args, arg) with ``name`` a placeholder."""
    out: list[tuple[str, str, tuple[int, ...], Any]] = []
    for i, s in enumerate(shapes):
        out.append(("unary", "", (i,), None))
        for ax in range(len(s)):
            out.append(("reduce", "", (i,), ax))
        if len(s) >= 2:
            perm = tuple(reversed(range(len(s))))
            out.append(("transpose", "", (i,), perm))
        if len(s) == 2:
            out.append(("reshape", "", (i,), (s[0] * s[1],)))
            out.append(("reshape", "", (i,), (s[1], s[0])))
        if len(s) == 1:
            out.extend(
                ("reshape", "", (i,), (s[0] // k, k)) for k in dims if s[0] % k == 0 and s[0] > k
            )
        if len(s) <= 2:
            out.extend(("broadcast", "", (i,), k) for k in dims[:1])
        out.append(("constrain", "", (i,), None))
        for j, t in enumerate(shapes):
            if s == t or (len(t) < len(s) and s[len(s) - len(t) :] == t):
                out.append(("binary", "", (i, j), None))
            if s and t and len(s) <= 2 and len(t) <= 2 and s[-1] == t[0]:
                out.append(("dot", "", (i, j), None))
    return out


def _result_shape(kind: str, arg: Any, operands: Sequence[Shape]) -> Shape:
    s = operands[0]
    if kind in ("unary", "constrain"):
        return s
    if kind == "binary":
        return s
    if kind == "dot":
        return s[:-1] + operands[1][1:]
    if kind == "reduce":
        return s[:arg] + s[arg + 1 :]
    if kind == "transpose":
        return tuple(s[p] for p in arg)
    if kind == "reshape":
        return tuple(arg)
    if kind == "broadcast":
        return (arg, *s)
    raise AssertionError(kind)


@st.composite
def programs(draw: Any) -> Program:
    mesh = draw(st.sampled_from(sorted(MESHES)))
    dims = DIMS[mesh]
    n_in = draw(st.integers(1, 2))
    in_shapes = tuple(
        tuple(draw(st.lists(st.sampled_from(dims), min_size=1, max_size=2))) for _ in range(n_in)
    )
    shapes: list[Shape] = list(in_shapes)
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 5))):
        # Counting back from the newest value: programs shrink towards chains.
        first = len(shapes) - 1 - draw(st.integers(0, len(shapes) - 1))
        options = [c for c in _candidates(shapes, dims) if c[2][0] == first]
        kind, _, args, arg = draw(st.sampled_from(options))
        name = ""
        if kind == "unary":
            name = draw(st.sampled_from(sorted(UNARY)))
        elif kind == "binary":
            name = draw(st.sampled_from(sorted(BINARY)))
        elif kind == "reduce":
            name = draw(st.sampled_from(["sum", "mean"]))
        elif kind == "constrain":
            arg = draw(specs(mesh, shapes[args[0]], allow_unconstrained=True))
        ops.append(Op(kind, name, args, arg))
        shapes.append(_result_shape(kind, arg, [shapes[a] for a in args]))
    last = len(shapes) - 1
    extra = draw(st.lists(st.integers(0, last), max_size=1))  # inputs may be outputs too
    outputs = (last, *extra)
    in_specs = tuple(draw(specs(mesh, s)) for s in in_shapes)
    out_specs = tuple(draw(specs(mesh, shapes[i])) for i in outputs)
    return Program(mesh, in_shapes, tuple(ops), outputs, in_specs, out_specs)


def _inputs(
    program: Program, seed: int, batch: dict[int, tuple[int, int]] | None = None
) -> list[Any]:
    """Inputs for ``program``; ``batch`` maps an input to (batch axis, size) for vmap."""
    rng = np.random.default_rng(seed)
    out = []
    for i, s in enumerate(program.in_shapes):
        shape = list(s)
        if batch and i in batch:
            axis, size = batch[i]
            shape.insert(axis, size)
        out.append(rng.uniform(-1.0, 1.0, shape).astype(np.float32))
    return out


# --- checks ---


def _assert_close(got: Any, want: Any) -> None:
    assert_tree_close(got, want, RTOL, ATOL_SCALE, scale_atol=True)


def _sum_of_outputs(f: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *xs: sum(jnp.sum(o) for o in f(*xs))


def check_forward(program: Program, mode: str) -> None:
    xs = _inputs(program, 0)
    want = jax.jit(program.fun(constrain=False))(*xs)
    with partitioner.spmd_partitioner(mode), mesh_ctx(*MESHES[program.mesh]) as mesh:
        got = pjit(program.fun(), program.in_specs, program.out_specs)(*xs)
        _assert_close(got, want)
        for out, spec in zip(got, program.out_specs, strict=True):
            assert_sharded_like(out, mesh, spec)


def check_grad(program: Program, mode: str, argnums: tuple[int, ...] | None = None) -> None:
    xs = _inputs(program, 1)
    argnums = tuple(range(len(xs))) if argnums is None else argnums
    want = jax.jit(jax.grad(_sum_of_outputs(program.fun(constrain=False)), argnums))(*xs)
    with partitioner.spmd_partitioner(mode), mesh_ctx(*MESHES[program.mesh]) as mesh:
        pf = pjit(program.fun(), program.in_specs, program.out_specs)
        got = jax.grad(_sum_of_outputs(pf), argnums)(*xs)
        _assert_close(got, want)
        # Cotangents are laid out like the inputs. An input no output depends on
        # gets a symbolic zero, which jax.grad instantiates itself (as for jax.jit).
        used = program.used_inputs()
        for g, i in zip(got, argnums, strict=True):
            if used[i]:
                assert_sharded_like(g, mesh, program.in_specs[i])


def check_vmap(
    program: Program, mode: str, in_axes: tuple[Any, ...], spmd_axis_name: str | None
) -> None:
    size = 2 if spmd_axis_name is None else _axis_size(program.mesh, (spmd_axis_name,))
    batch = {
        i: (a % (len(s) + 1), size)
        for i, (a, s) in enumerate(zip(in_axes, program.in_shapes, strict=True))
        if a is not None
    }
    xs = _inputs(program, 2, batch)
    want = jax.vmap(jax.jit(program.fun(constrain=False)), in_axes)(*xs)
    with partitioner.spmd_partitioner(mode), mesh_ctx(*MESHES[program.mesh]):
        pf = pjit(program.fun(), program.in_specs, program.out_specs)
        got = jax.vmap(pf, in_axes, spmd_axis_name=spmd_axis_name)(*xs)
        _assert_close(got, want)


def _free_axes(program: Program) -> list[str]:
    """Mesh axes no in/out spec or constraint uses: candidates for ``spmd_axis_name``."""
    _, names = MESHES[program.mesh]
    used: set[str] = set()
    all_specs = [
        *program.in_specs,
        *program.out_specs,
        *(op.arg for op in program.ops if op.kind == "constrain"),
    ]
    for spec in all_specs:
        for entry in spec or ():
            if isinstance(entry, str):
                used.add(entry)
            elif isinstance(entry, tuple):
                used.update(entry)
    return [n for n in names if n not in used]


MODES = st.sampled_from(["gspmd", "shardy"])


@SETTINGS
@given(program=programs(), mode=MODES)
def test_random_program_pjit_matches_jit(program: Program, mode: str) -> None:
    check_forward(program, mode)


@SETTINGS
@given(program=programs(), mode=MODES, data=st.data())
def test_random_program_grad_matches_jit(program: Program, mode: str, data: Any) -> None:
    # All inputs, or one of two (the other's cotangent stays a symbolic zero).
    n = len(program.in_shapes)
    argnums = data.draw(st.sampled_from([tuple(range(n)), *((i,) for i in range(n) if n > 1)]))
    check_grad(program, mode, argnums)


@SETTINGS
@given(program=programs(), mode=MODES, data=st.data())
def test_random_program_vmap_matches_jit(program: Program, mode: str, data: Any) -> None:
    in_axes = tuple(data.draw(st.sampled_from([0, None, -1])) for _ in program.in_shapes)
    if all(a is None for a in in_axes):
        in_axes = (0, *in_axes[1:])
    free = _free_axes(program)
    spmd = data.draw(st.sampled_from([None, *free]))
    check_vmap(program, mode, in_axes, spmd)
