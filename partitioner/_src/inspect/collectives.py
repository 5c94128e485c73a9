"""The collectives XLA inserted, read from the partitioned HLO and mapped back to mesh axes.

NOTE [collective table]: the partitioned module (``Compiled.as_text()``) is one
program per device. Each collective instruction names its kind, its result
shape (per device), its replica groups and, in its metadata, the jax operation
and source line it came from. This module parses those lines; it does not run
anything. Replica groups come in three spellings, all expanded to explicit
groups of device positions: ``{{0,1},{2,3}}``, the iota form ``[2,4]<=[4,2]T(1,0)``
and the mesh form ``mesh['axis_0'=4,'axis_1'=2] device_ids=(...) {'axis_0'}``.
Groups are then matched against every subset of the *user's* mesh axes: the
subset whose devices-varying-together are exactly those groups names the
collective ("over 'model'"). A collective inside a ``while`` body counts once per
iteration where XLA knows the trip count (``known_trip_count``), nested loops
multiplying.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from jax.sharding import Mesh

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SHAPE = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([0-9,]*)\]")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\("
)
# A computation's header: its name, then its parameters in parentheses (an instruction's
# name is followed by ``=``). Parameter lists may hold ``/*index=5*/`` comments.
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%(?P<name>[\w.\-]+)\s+\(.*\{\s*$")
_SOURCE = re.compile(r'source_file="(?P<file>[^"]+)"\s+source_line=(?P<line>\d+)')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_OP_NAME = re.compile(r'op_name="(?P<op>[^"]+)"')


@dataclass(frozen=True)
class Collective:
    """One collective of the partitioned program (a row of the collective table).

    Attributes:
        kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` or
            ``collective-permute``.
        shape: one device's operand (the first, for tuples): for an all-gather
            the slice it contributes, for a reduce-scatter the whole value it reduces.
        dtype: that operand's dtype.
        bytes_per_device: the bytes each device sends: its operands' size.
        count: executions per run of the program (loop trip counts included).
        axes: the mesh axes the groups span (``()``: a group per device; ``None``:
            groups no set of mesh axes describes).
        groups: the replica groups (or source-target pairs), as device positions.
        op_name / source: the jax operation and ``file:line`` XLA kept, if any.
        in_loop: whether it runs inside a ``while`` loop of the program (a ``scan``'s,
            a pipeline's): once per trip, not once per run.
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str
    bytes_per_device: int
    count: int
    axes: tuple[str, ...] | None
    groups: tuple[tuple[int, ...], ...]
    op_name: str | None
    source: str | None
    in_loop: bool = False

    @property
    def bytes_per_run(self) -> int:
        """The bytes each device sends for this row in one run of the program
        (``bytes_per_device`` times ``count``): what tables add up."""
        return self.bytes_per_device * self.count

    def describe_axes(self) -> str:
        if self.axes is None:
            return "unmapped groups " + str([list(g) for g in self.groups])
        return "over " + ", ".join(repr(a) for a in self.axes) if self.axes else "no devices"


def _shapes(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (dtype, tuple(int(d) for d in dims.split(",") if d))
        for dtype, dims in _SHAPE.findall(type_text)
        if dtype in _DTYPE_BYTES
    ]


def _nbytes(dtype: str, shape: Sequence[int]) -> int:
    return _DTYPE_BYTES[dtype] * math.prod(shape)


def parse_groups(line: str, n_devices: int) -> tuple[tuple[int, ...], ...]:
    """The replica groups of a collective line (every device alone if it names none)."""
    if "source_target_pairs=" in line:
        pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
        found = re.findall(r"\{(\d+),(\d+)\}", pairs.group(0) if pairs else "")
        return tuple((int(a), int(b)) for a, b in found)
    mesh_form = re.search(
        r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>[^)]*\)?)\))?\s*\{(?P<over>[^}]*)\}",
        line,
    )
    if mesh_form:
        axes = re.findall(r"'([^']+)'=(\d+)", mesh_form.group("axes"))
        names = [a for a, _ in axes]
        sizes = [int(s) for _, s in axes]
        ids = _iota(mesh_form.group("ids"), math.prod(sizes)) if mesh_form.group("ids") else None
        positions = (np.arange(math.prod(sizes)) if ids is None else ids).reshape(sizes)
        over = [names.index(a) for a in re.findall(r"'([^']+)'", mesh_form.group("over"))]
        return _groups_over(positions, over)
    iota = re.search(r"replica_groups=(\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)", line)
    if iota:
        text = iota.group(1)
        shape = [int(d) for d in text[1 : text.index("]")].split(",")]
        ids = _iota(text[text.index("<=") + 2 :], math.prod(shape))
        return tuple(tuple(int(i) for i in row) for row in ids.reshape(shape[0], -1))
    explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)?\}", line)
    if explicit and explicit.group(1):
        return tuple(
            tuple(int(i) for i in g.split(",") if i)
            for g in re.findall(r"\{([\d,]*)\}", explicit.group(1))
        )
    return (tuple(range(n_devices)),)


def _iota(text: str, size: int) -> np.ndarray:
    """``[4,2]T(1,0)`` or ``[8]``: an iota reshaped, maybe transposed, flattened."""
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    dims = [int(d) for d in text[text.index("[") + 1 : text.index("]")].split(",")]
    ids = np.arange(size).reshape(dims)
    perm = re.search(r"T\(([\d,]+)\)", text)
    if perm:
        ids = ids.transpose([int(p) for p in perm.group(1).split(",")])
    return ids.reshape(-1)


def _groups_over(positions: np.ndarray, over: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Devices that differ only along the axes ``over`` of ``positions``, as groups."""
    rest = [i for i in range(positions.ndim) if i not in over]
    moved = positions.transpose([*rest, *over])
    n = math.prod(positions.shape[i] for i in over) if over else 1
    return tuple(tuple(int(x) for x in row) for row in moved.reshape(-1, n))


def axes_of(groups: Sequence[Sequence[int]], mesh: Mesh) -> tuple[str, ...] | None:
    """The set of ``mesh`` axes whose devices-varying-together are ``groups`` (positions)."""
    want = {frozenset(g) for g in groups}
    positions = np.arange(mesh.size).reshape(mesh.devices.shape)
    names = list(mesh.axis_names)
    for k in range(len(names) + 1):
        for subset in itertools.combinations(range(len(names)), k):
            got = {frozenset(g) for g in _groups_over(positions, subset)}
            if got == want:
                return tuple(names[i] for i in subset)
    return None


def _trip_counts(lines: Sequence[str]) -> dict[str, tuple[int, bool]]:
    """How many times each computation runs per execution (while bodies by trip count),
    and whether it runs inside a ``while`` loop."""
    calls: dict[str, list[tuple[str, int, bool]]] = {}
    entry, current = None, None
    for line in lines:
        head = _COMPUTATION.match(line)
        if head:
            current = head.group("name")
            calls.setdefault(current, [])
            if line.lstrip().startswith("ENTRY"):
                entry = current
            continue
        if current is None:
            continue
        loop = re.search(r"\bwhile\(", line)
        if loop:
            body = re.search(r"body=%([\w.\-]+)", line)
            cond = re.search(r"condition=%([\w.\-]+)", line)
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
            n = int(trips.group(1)) if trips else 1
            if body:
                calls[current].append((body.group(1), n, True))
            if cond:
                calls[current].append((cond.group(1), n + 1, True))
            continue
        for attr in re.finditer(
            r"(?:calls|to_apply|true_computation|false_computation)=%([\w.\-]+)", line
        ):
            calls[current].append((attr.group(1), 1, False))
        for group in re.finditer(r"(?:branch_computations|called_computations)=\{([^}]*)\}", line):
            for name in re.findall(r"%([\w.\-]+)", group.group(1)):
                calls[current].append((name, 1, False))
    counts: dict[str, tuple[int, bool]] = {}

    def visit(name: str, times: int, looped: bool) -> None:
        before, was_looped = counts.get(name, (0, False))
        counts[name] = (before + times, was_looped or looped)
        for callee, n, loop in calls.get(name, []):
            visit(callee, times * n, looped or loop)

    if entry is not None:
        visit(entry, 1, False)
    return counts


def _stack_frames(lines: Sequence[str]) -> dict[int, str]:
    """``stack_frame_id`` -> ``file:line (function)`` from the module's frame tables.

    XLA prints the tables (``FileNames``, ``FunctionNames``, ``FileLocations``,
    ``StackFrames``) before the computations; an instruction names its innermost
    frame, which is the user's line (jax and partitioner skip their own files).
    """
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in lines:
        stripped = line.strip()
        if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(stripped, {})
            continue
        if current is None:
            continue
        entry = re.match(r"(\d+)\s+(.*)", stripped)
        if not entry:
            if stripped.startswith(("%", "ENTRY", "HloModule")):
                break
            continue
        current[int(entry.group(1))] = entry.group(2).strip().strip('"')
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations = {}
    for key, text in tables.get("FileLocations", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", text))
        file = files.get(int(fields.get("file_name_id", 0)), "?")
        function = functions.get(int(fields.get("function_name_id", 0)), "?")
        locations[key] = f"{file}:{fields.get('line', '?')} ({function})"
    frames = {}
    for key, text in tables.get("StackFrames", {}).items():
        location = re.search(r"file_location_id=(\d+)", text)
        if location and int(location.group(1)) in locations:
            frames[key] = locations[int(location.group(1))]
    return frames


def collectives(hlo_texts: Iterable[str], mesh: Mesh) -> list[Collective]:
    """Every collective of the partitioned modules, with its axes and count."""
    out: list[Collective] = []
    for text in hlo_texts:
        lines = text.splitlines()
        counts = _trip_counts(lines)
        frames = _stack_frames(lines)
        current = None
        for line in lines:
            head = _COMPUTATION.match(line)
            if head:
                current = head.group("name")
                continue
            match = _INSTRUCTION.match(line)
            if not match or current is None:
                continue
            shapes = _shapes(match.group("type"))
            if not shapes:
                continue
            kind = match.group("op")
            groups = parse_groups(line, mesh.size)
            group = max(len(groups[0]), 1) if groups else 1
            scaled = re.search(r"dimensions=\{(\d+)\}", line)
            if kind in ("all-gather", "reduce-scatter") and scaled:
                # The result is gathered (scattered) along that dim: the operand is
                # the result divided (multiplied) by the group size there.
                d = int(scaled.group(1))
                shapes = [
                    (dtype, tuple(
                        (n // group if kind == "all-gather" else n * group) if i == d else n
                        for i, n in enumerate(shape)
                    ))
                    for dtype, shape in shapes
                ]  # fmt: skip
            moved = sum(_nbytes(d, s) for d, s in shapes)
            source = _SOURCE.search(line)
            frame = _FRAME.search(line)
            op_name = _OP_NAME.search(line)
            out.append(
                Collective(
                    kind=kind,
                    shape=shapes[0][1],
                    dtype=shapes[0][0],
                    bytes_per_device=moved,
                    count=counts.get(current, (1, False))[0] or 1,
                    in_loop=counts.get(current, (1, False))[1],
                    axes=_permute_axes(groups, mesh)
                    if kind == "collective-permute"
                    else axes_of(groups, mesh),
                    groups=groups,
                    op_name=op_name.group("op") if op_name else None,
                    source=f"{source.group('file')}:{source.group('line')}"
                    if source
                    else frames.get(int(frame.group(1)))
                    if frame
                    else None,
                )
            )
    return out


def _permute_axes(pairs: Sequence[Sequence[int]], mesh: Mesh) -> tuple[str, ...] | None:
    """The mesh axes a collective-permute moves data along (the axes its pairs differ on)."""
    positions = np.arange(mesh.size).reshape(mesh.devices.shape)
    coords = {int(p): np.argwhere(positions == p)[0] for p in positions.flat}
    moved: set[int] = set()
    for src, dst in pairs:
        moved |= {int(i) for i in np.nonzero(coords[src] != coords[dst])[0]}
    return tuple(mesh.axis_names[i] for i in sorted(moved))
