"""The stages' orders of actions as lock-step rounds: what the program runs, and where.

NOTE [pipeline rounds]: a schedule that runs by actions (1F1B, interleaved 1F1B, zero
bubble; NOTE [pipeline actions]) is one SPMD program: a loop whose every trip is one
*round*, in which each stage runs one action of its order (a forward, or a backward,
``B``: a whole one, or zero bubble's input gradient), zero bubble also one weight
gradient (``W``, first), and then every stage sends what its action made to its
neighbour, in **one** collective-permute of static pairs. A round's permute is one of
three patterns, in three phases:

- while no backward can run, every stage sends on (``s`` to ``s + 1``): the forwards
  before the first backward run back to back;
- then the rounds' *parity* pairs the stages: in a round, the stages ``s = p (mod 2)``
  (``p`` the round's parity) send forward to ``s + 1`` and those stages send back to
  ``s``, so a stage runs forwards only in rounds of one parity and backwards only in the
  others, and the sends of both directions fit one permute (the loop's body is two
  rounds, one of each parity; a ring, stage ``S - 1`` to 0, for interleaved 1F1B, whose
  ``S`` must then be even);
- once every forward has run, every stage sends back (``s`` to ``s - 1``).

For 1F1B this gives ``2 M + 2 S - 2`` rounds (a forward and a backward a stage in every
two rounds of the steady state) and at most that many permutes: gpipe's ``2 (M + S -
1)``. A head's forward and the first stage's last backward send nothing, a weight
gradient neither: zero bubble's run inside the rounds of the others, and rounds after
the last send have no permute. A round runs as long as its dearest action on real
hardware: the table (NOTE [pipeline actions]) is the timeline the same orders give a
pipeline whose stages do not wait for each other's rounds.

Each stage runs its order as early as the parity and its inputs allow (an input is
there the round after the one that sent it), a weight gradient not before the actions its
order puts before it. The values a microbatch's visit leaves for later (the input
received, the gradient received, a forward's residuals, what an input gradient leaves
for its weight gradient) sit in *pools*, one per dtype: a pool is a row of *units* (the
greatest common divisor of its values' sizes), and a value takes a run of them, given
out as the rounds run (the first run free that fits) and taken back after its last
reader. A pool is as large as the most any stage holds at once, never ``M`` values (the
program is the same on every device, so it is sized for the stage that holds the most;
one pool for every shape lets a stage that holds many small values and one that holds
a few large ones share that size). A value no action makes or reads goes to a spare run
past the pool's end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from .actions import Order

#: The branch each round runs: a code per combination of a stage's actions.
IDLE, FORWARD, HEAD, BACKWARD, INPUT, WEIGHT, FORWARD_WEIGHT, HEAD_WEIGHT, INPUT_WEIGHT = range(9)
CODE_NAMES = ("idle", "F", "F+head", "B", "B(input)", "W", "W, F", "W, F+head", "W, B(input)")
#: The fields of a round's row; a value's slot follows as ``"c:" + name`` (read by the
#: comm action), ``"w:" + name`` (read by the weight gradient) and ``"mk:" + name`` (made
#: by the comm action); a slot no action of the round uses is the pool's spare one.
FIELDS = ("code", "m", "v", "wm", "wv", "recv", "dx")


@dataclasses.dataclass(frozen=True, eq=False)
class Values:
    """What a schedule's actions read and make (NOTE [pipeline rounds]).

    Attributes:
        pools: per value name (``"in"``, ``"ct"``, a residual's ...), its pool.
        reads: per action letter (``F``, ``B``, ``I``, ``W``), the values it reads.
        makes: per action letter, the values it makes (``"ct"`` made by the head's
            forward, the received ones by the neighbours' actions).
        units: per value name, the units of its pool it takes (1 if not given).
    """

    pools: Mapping[str, Hashable]
    reads: Mapping[str, tuple[str, ...]]
    makes: Mapping[str, tuple[str, ...]]
    units: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.pools)

    def _canonical(self) -> tuple[Any, ...]:
        maps = (self.pools, self.reads, self.makes, self.units)
        return tuple(tuple(sorted(m.items())) for m in maps)

    def length(self, name: str) -> int:
        return self.units.get(name, 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Values) and self._canonical() == other._canonical()

    def __hash__(self) -> int:
        return hash(self._canonical())


@dataclasses.dataclass(frozen=True)
class Rounds:
    """The program of a schedule that runs by actions (NOTE [pipeline rounds]).

    Attributes:
        table: ``[stages, rounds, fields]`` ints: per stage and round, the branch
            (``code``), the comm action's microbatch and visit, the weight gradient's,
            the slot a received value goes to, the row of the input's gradient
            (``M``: none), and each value's slot.
        fields: the names of the last dimension.
        pool_sizes: per pool, its units (a spare run as long as its longest value
            past them).
        segments: the rounds as loops, in order: each a body of one or two rounds'
            permutes (the (source, target) stages of each; None: no permute) and its
            trips.
        codes: the branches the table uses.
    """

    table: np.ndarray
    fields: tuple[str, ...]
    pool_sizes: Mapping[Hashable, int]
    segments: tuple[tuple[tuple[Pairs | None, ...], int], ...]
    codes: tuple[int, ...]

    @property
    def sends(self) -> int:
        """The rounds that end with a permute."""
        return sum(trips * sum(p is not None for p in body) for body, trips in self.segments)

    @property
    def rounds(self) -> int:
        return int(self.table.shape[1])

    def column(self, name: str) -> int:
        return self.fields.index(name)


#: A permute's (source, target) stages.
Pairs = tuple[tuple[int, int], ...]


def pairs_of(stages: int, ring: bool) -> tuple[Pairs, Pairs]:
    """Per round parity, the permute's (source, target) pairs (NOTE [pipeline rounds])."""
    out = []
    for parity in (0, 1):
        pairs = []
        for s in range(parity, stages - 1, 2):
            pairs += [(s, s + 1), (s + 1, s)]
        if ring and stages > 1 and (stages - 1) % 2 == parity:
            pairs += [(stages - 1, 0), (0, stages - 1)]
        out.append(tuple(pairs))
    return out[0], out[1]


def shift_pairs(stages: int, ring: bool, by: int) -> Pairs:
    """Every stage sending to the next (``by=1``) or the one before (``by=-1``)."""
    return tuple((s, (s + by) % stages) for s in range(stages) if ring or 0 <= s + by < stages)


def schedule_rounds(
    orders: Sequence[Order], visits: int, microbatches: int, values: Values, *, ring: bool
) -> Rounds:
    """The rounds that run ``orders`` (one per stage) in lock step, and the slots of
    every value (NOTE [pipeline rounds]).

    Raises:
        ValueError: orders the rounds cannot run (an internal error).
    """
    run = _Run(orders, visits, microbatches, values, ring)
    run.go()
    return run.result()


class _Run:
    """The lock-step simulation behind :func:`schedule_rounds`."""

    def __init__(
        self, orders: Sequence[Order], visits: int, microbatches: int, values: Values, ring: bool
    ):
        self.orders, self.visits, self.count, self.values = orders, visits, microbatches, values
        self.stages = len(orders)
        self.ring = ring
        self.done: dict[tuple[str, int, int, int], int] = {}  # action -> its round
        self.ready: dict[tuple[str, int, int, int], int] = {}  # (value, m, v, stage) -> round
        self.slot: dict[tuple[str, int, int, int], int] = {}
        pools = set(values.pools.values())
        # each stage's own slots: a device holds its stage's values only
        # each stage's own runs, free (start, length), and high-water mark: a device
        # holds its stage's values only
        self.free: list[dict[Hashable, list[tuple[int, int]]]] = [
            {p: [] for p in pools} for _ in orders
        ]
        self.size: list[dict[Hashable, int]] = [dict.fromkeys(pools, 0) for _ in orders]
        self.readers = {
            name: [letter for letter, names in values.reads.items() if name in names]
            for name in values.names
        }
        self.position = [0] * self.stages  # next action of each order
        self.rows: list[list[dict[str, int]]] = [[] for _ in range(self.stages)]
        self.last_send = -1
        self.round_pairs: list[Pairs] = []
        # NOTE [pipeline rounds]: forwards only while no backward can run, then the
        # rounds' parity, then backwards only once every forward has run
        self.phase, self.offset = "forward", 0

    # --- the values' slots ---

    def _alloc(self, name: str, m: int, v: int, stage: int) -> int:
        """The first free run of the pool that fits ``name`` (else a new one at its end)."""
        pool, length = self.values.pools[name], self.values.length(name)
        free, size = self.free[stage][pool], self.size[stage]
        fit = next((k for k, (_, n) in enumerate(free) if n >= length), None)
        if fit is None:
            start = size[pool]
            if free and free[-1][0] + free[-1][1] == start:  # grow the last free run
                start = free.pop()[0]
            size[pool] = start + length
        else:
            start, n = free.pop(fit)
            if n > length:
                free.insert(fit, (start + length, n - length))
        self.slot[(name, m, v, stage)] = start
        return start

    def _give_back(self, name: str, stage: int, start: int) -> None:
        pool, length = self.values.pools[name], self.values.length(name)
        runs = sorted([*self.free[stage][pool], (start, length)])
        merged: list[tuple[int, int]] = []
        for s, n in runs:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self.free[stage][pool] = merged

    def _from_x(self, name: str, m: int, v: int, stage: int) -> bool:
        return name == "in" and stage == 0 and v == 0

    def _release(self, letter: str, m: int, v: int, stage: int) -> None:
        """Give back the slots whose last reader is this action."""
        order = self.orders[stage]
        later = {lt for lt, mm, vv in order[self.position[stage] :] if (mm, vv) == (m, v)}
        for name in self.values.reads.get(letter, ()):
            if self._from_x(name, m, v, stage) or (name, m, v, stage) not in self.slot:
                continue
            if not any(r in later for r in self.readers[name] if r != letter):
                self._give_back(name, stage, self.slot.pop((name, m, v, stage)))

    # --- the rounds ---

    def _next(self, stage: int, letters: str) -> tuple[int, str, int, int] | None:
        """The next action of ``stage``'s order among ``letters``: (index, letter, m, v)."""
        order = self.orders[stage]
        for k in range(self.position[stage], len(order)):
            if order[k][0] in letters:
                return (k, *order[k])
        return None

    def _target(self, stage: int, letter: str, v: int) -> int | None:
        """The stage an action sends to (None: it sends nothing)."""
        if letter == "W" or (letter == "F" and self._is_head(stage, v)):
            return None
        if letter == "F":
            return (stage + 1) % self.stages
        return None if stage == 0 and v == 0 else (stage - 1) % self.stages

    def _ready(self, t: int, stage: int, letter: str, m: int, v: int) -> bool:
        if letter == "W":
            return self.done.get(("I", m, v, stage), t) < t
        if letter == "F":
            return self._from_x("in", m, v, stage) or self.ready.get(("in", m, v, stage), t) < t
        return (
            self.done.get(("F", m, v, stage), t) < t and self.ready.get(("ct", m, v, stage), t) < t
        )

    def _can(self, t: int, stage: int, letter: str, m: int, v: int) -> bool:
        target = self._target(stage, letter, v)
        if target is not None and (stage, target) not in self.round_pairs[t]:
            return False
        return self._ready(t, stage, letter, m, v)

    def _pairs(self, t: int) -> Pairs:
        """Round ``t``'s permute (NOTE [pipeline rounds])."""
        if self.phase == "forward":
            for stage in range(self.stages):
                comm = self._next(stage, "FBI")
                if comm is None or comm[1] == "F" or self._target(stage, comm[1], comm[3]) is None:
                    continue
                if self._ready(t, stage, *comm[1:]):  # a backward could run: pair the stages
                    self.phase, self.offset = "parity", t - (stage - 1) % 2
                    break
        if self.phase == "parity" and all(self._next(s, "F") is None for s in range(self.stages)):
            self.phase = "backward"
        if self.phase == "forward":
            return shift_pairs(self.stages, self.ring, 1)
        if self.phase == "backward":
            return shift_pairs(self.stages, self.ring, -1)
        return pairs_of(self.stages, self.ring)[(t - self.offset) % 2]

    def _is_head(self, stage: int, v: int) -> bool:
        return stage == self.stages - 1 and v == self.visits - 1

    def go(self) -> None:
        t, idle_rounds = 0, 0
        while any(p < len(o) for p, o in zip(self.position, self.orders, strict=True)):
            self.round_pairs.append(self._pairs(t))
            sent = [self._round(t, stage) for stage in range(self.stages)]
            for stage, message in enumerate(sent):
                if message is not None:
                    self._deliver(t, stage, *message)
            progressed = any(self.rows[s][-1]["code"] != IDLE for s in range(self.stages))
            idle_rounds = 0 if progressed else idle_rounds + 1
            if idle_rounds > 2:
                raise ValueError(f"internal error: the pipeline's rounds stall at round {t}")
            t += 1

    def _round(self, t: int, stage: int) -> tuple[str, int, int] | None:
        """Stage ``stage``'s round ``t``: its row, and what it sends (the value's name on
        the receiving side, microbatch, visit)."""
        row = dict.fromkeys(FIELDS, 0)
        row["dx"], row["recv"] = self.count, -1
        order = self.orders[stage]
        comm = self._next(stage, "FBI")
        weight = self._next(stage, "W")
        # A weight gradient runs first in its round; not before the actions its order
        # puts before it.
        w_ok = (
            weight is not None
            and (comm is None or weight[0] < comm[0])
            and self._can(t, stage, "W", weight[2], weight[3])
        )
        c_ok = comm is not None and self._can(t, stage, *comm[1:])
        if c_ok and comm is not None:
            pending_w = [k for k in range(self.position[stage], comm[0]) if order[k][0] == "W"]
            c_ok = not pending_w or (w_ok and len(pending_w) == 1)
        message = None
        if w_ok and weight is not None:
            self._do(t, stage, row, "w", weight)
        if c_ok and comm is not None:
            if w_ok:  # the weight gradient was the next in the order: the comm action follows
                comm = self._next(stage, "FBI")
                assert comm is not None
            message = self._do(t, stage, row, "c", comm)
        row["code"] = _code(row.get("letter_c"), row.get("letter_w"), row.get("head", 0))
        for key in ("letter_c", "letter_w", "head"):
            row.pop(key, None)
        self.rows[stage].append(row)
        return message

    def _do(
        self,
        t: int,
        stage: int,
        row: dict[str, int],
        prefix: str,
        action: tuple[int, str, int, int],
    ) -> tuple[str, int, int] | None:
        k, letter, m, v = action
        order = self.orders[stage]
        assert k == self.position[stage], (k, self.position[stage], order[k])
        self.position[stage] += 1
        self.done[(letter, m, v, stage)] = t
        row[f"letter_{prefix}"] = ord(letter)
        if prefix == "w":
            row["wm"], row["wv"] = m, v
        else:
            row["m"], row["v"] = m, v
        for name in self.values.reads.get(letter, ()):
            key = (name, m, v, stage)
            row[f"{prefix}:{name}"] = -1 if self._from_x(name, m, v, stage) else self.slot[key]
        self._release(letter, m, v, stage)
        made = list(self.values.makes.get(letter, ()))
        head = letter == "F" and self._is_head(stage, v)
        if head:
            made.append("ct")
            row["head"] = 1
        for name in made:
            row[f"mk:{name}"] = self._alloc(name, m, v, stage)
            self.ready[(name, m, v, stage)] = t
        if letter == "F" and not head:
            target, nv = (stage + 1, v) if stage < self.stages - 1 else (0, v + 1)
            return ("in", m, nv) if (target, nv) != (stage, v) else None
        if letter in "BI":
            if stage == 0 and v == 0:
                row["dx"] = m
                return None
            return ("ct", m, v) if stage > 0 else ("ct", m, v - 1)
        return None

    def _deliver(self, t: int, source: int, name: str, m: int, v: int) -> None:
        forward = name == "in"
        target = (source + 1) % self.stages if forward else (source - 1) % self.stages
        if (source, target) not in self.round_pairs[t]:
            raise ValueError(
                f"internal error: round {t} sends {source} -> {target}, not in its permute"
            )
        self.last_send = max(self.last_send, t)
        self.rows[target][t]["recv"] = self._alloc(name, m, v, target)
        self.ready[(name, m, v, target)] = t

    def result(self) -> Rounds:
        names = self.values.names
        fields = (*FIELDS, *(f"{use}:{n}" for use in ("c", "w", "mk") for n in names))
        permutes: list[Pairs | None] = [
            pairs if t <= self.last_send else None for t, pairs in enumerate(self.round_pairs)
        ]
        table = np.zeros((self.stages, len(self.rows[0]), len(fields)), np.int32)
        sizes = {
            pool: max(size[pool] for size in self.size) for pool in set(self.values.pools.values())
        }
        # a value no action of the round makes or reads: the spare run past the pool
        spare = {f: sizes[self.values.pools[f.split(":")[1]]] for f in fields if ":" in f}
        for stage, rows in enumerate(self.rows):
            for t, row in enumerate(rows):
                if row["recv"] < 0:  # a value no action reads: the spare slot
                    row["recv"] = sizes[self.values.pools["in"]]
                table[stage, t] = [row.get(f, spare.get(f, 0)) for f in fields]
        codes = tuple(sorted({int(c) for c in table[:, :, 0].flat}))
        return Rounds(
            table=table,
            fields=fields,
            pool_sizes=sizes,
            segments=_segments(permutes),
            codes=codes,
        )


def _segments(permutes: Sequence[Pairs | None]) -> tuple[tuple[tuple[Pairs | None, ...], int], ...]:
    """The rounds' permutes as loops: runs of one repeated permute, or of two in turn."""
    out: list[tuple[tuple[Pairs | None, ...], int]] = []
    t = 0
    while t < len(permutes):
        one = permutes[t]
        n = 1
        while t + n < len(permutes) and permutes[t + n] == one:
            n += 1
        if n == 1 and t + 3 < len(permutes) and permutes[t + 2] == one:
            two = permutes[t + 1]
            k = 1
            while t + 2 * k + 1 < len(permutes) and permutes[t + 2 * k : t + 2 * k + 2] == [
                one,
                two,
            ]:
                k += 1
            out.append(((one, two), k))
            t += 2 * k
            continue
        out.append(((one,), n))
        t += n
    return tuple(out)


def _code(comm: int | None, weight: int | None, head: int) -> int:
    letter = None if comm is None else chr(comm)
    if letter is None:
        return WEIGHT if weight is not None else IDLE
    if letter == "F":
        if head:
            return HEAD_WEIGHT if weight is not None else HEAD
        return FORWARD_WEIGHT if weight is not None else FORWARD
    if letter == "B":
        return BACKWARD
    return INPUT_WEIGHT if weight is not None else INPUT
