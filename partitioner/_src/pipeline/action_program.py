"""The program of a schedule that runs by actions: every stage its own branch, each round.

NOTE [pipeline by actions]: 1F1B, interleaved 1F1B and zero bubble (NOTE [pipeline
actions]) need each stage to do its own action at each round (NOTE [pipeline
rounds]): a forward on one stage while its neighbour runs a backward. In the
auto-SPMD program of gpipe (NOTE [pipeline]) a branch on the stage is batched over
the stage dimension into a select of every branch: every stage would compute every
action. So this program is a *manual* region (``pmap_region_p``, NOTE [pmap region];
lowered by ``lower/manual.py`` as ``sdy.manual_computation`` or GSPMD's
full-to-shard / shard-to-full pair) over the stage axis, nested in one over each
batch axis: each device runs the per-device body on its blocks (its stage's weights
and its shard of every microbatch), reads its row of the rounds' table, and
``lax.switch`` on the row's code is a real conditional on each device, so the
stages' devices run different branches of one program. The mesh's other axes (tensor
parallel inside a layer) stay XLA's to partition.

Gradients are computed as the rounds run (NOTE [pipeline passes]): a stage adds each
backward's weight gradients to its own accumulator, never sent inside the loop; after
it, the accumulators are summed over the batch axes (one all-reduce of the stage's
weights), the loss and the head's gradients over every device, the input's gradient
(made on stage 0) over the stages. Each round ends with at most one ``lax.ppermute`` of
static pairs over the stage axis (NOTE [pipeline rounds]).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from .. import pmap_registry as _pmap_registry  # noqa: F401  (installs pmap_region_p's rules)
from ..primitives.pmap_region import in_region
from . import rounds as rd
from .passes import Passes
from .program import Saves


@dataclasses.dataclass(frozen=True)
class Wants:
    """Which gradients the caller differentiates (a ``custom_vjp``'s perturbed inputs)."""

    head: bool
    x: bool
    targets: bool


@dataclasses.dataclass(frozen=True)
class ActionProgram:
    """What the region's body needs that tracing does not give (NOTE [pipeline by actions]).

    Attributes:
        passes: the visit's pieces (NOTE [pipeline passes]).
        rounds: the rounds and slots (NOTE [pipeline rounds]).
        values: the names, pools and readers of the values the rounds keep.
        shapes: per value name, its leaves' shapes and dtypes.
        head: ``head(head_params, h, targets) -> loss`` on a microbatch's shard.
        saves: what a forward keeps.
        mesh, axis, batch: the region's axes: the stages', then the batch axes.
        microbatches: ``M``.
        visits: each stage's visits (``R``; 1 for 1F1B and zero bubble).
    """

    passes: Passes
    rounds: rd.Rounds
    values: rd.Values
    shapes: dict[str, tuple[tuple[tuple[int, ...], Any], ...]]
    head: Callable[..., Any]
    saves: Saves
    mesh: Mesh
    axis: str
    batch: tuple[str, ...]
    microbatches: int
    visits: int

    @property
    def shards(self) -> int:
        return math.prod(int(self.mesh.shape[a]) for a in self.batch)


def values_of(
    passes: Passes, saves: Saves, h_avals: Sequence[Any], split: bool
) -> tuple[rd.Values, dict[str, tuple[tuple[tuple[int, ...], Any], ...]]]:
    """The values the rounds keep (NOTE [pipeline rounds]) for ``passes``, and their
    leaves' shapes: the input and the gradient received (``in``, ``ct``), each kept
    residual (``r<i>``), and, for a split backward, what the input gradient leaves its
    weight gradient (``q<j>``; saving inputs, the residuals it reads too, ``s<i>``).
    Values of one dtype share a pool, in units of the greatest common divisor of their
    sizes."""
    kept = [i for i, k in enumerate(passes.kept) if k]
    residuals = dict(zip(kept, passes.residual_avals, strict=True))
    from_input = passes.from_input
    shapes: dict[str, list[Any]] = {"in": list(h_avals), "ct": list(h_avals)}

    def named(piece: str) -> list[str]:
        indices, reads_ct = passes.reads[piece]
        names = [f"r{i}" for i in indices if i in residuals]
        if saves is Saves.INPUTS:
            names = [n.replace("r", "s") for n in names] if piece == "W" else ["in"]
        if any(from_input[i] for i in indices) and "in" not in names:
            names.append("in")
        return [*names, *(["ct"] if reads_ct else [])]

    reads: dict[str, tuple[str, ...]] = {"F": ("in",)}
    makes: dict[str, tuple[str, ...]] = {}
    if saves is Saves.ACTIVATIONS:
        makes["F"] = tuple(f"r{i}" for i in kept)
        shapes.update({f"r{i}": [residuals[i]] for i in kept})
    if not split:
        reads["B"] = tuple(named("B"))
    else:
        reads["I"] = tuple(named("I"))
        q = [f"q{j}" for j in range(len(passes.q_avals))]
        shapes.update({name: [aval] for name, aval in zip(q, passes.q_avals, strict=True)})
        recomputed = [n for n in named("W") if n.startswith("s")]
        shapes.update({n: [residuals[int(n[1:])]] for n in recomputed})
        makes["I"] = (*q, *recomputed)
        reads["W"] = (*named("W"), *q)
    described = {n: tuple((tuple(a.shape), a.dtype) for a in avals) for n, avals in shapes.items()}
    pools: dict[str, Hashable] = {}
    sizes: dict[str, int] = {}
    for name, leaves in described.items():
        (pools[name],) = {str(dtype) for _, dtype in leaves}  # one dtype: checks.py
        sizes[name] = sum(math.prod(shape) for shape, _ in leaves)
    unit = {
        pool: math.gcd(*(sizes[n] for n in pools if pools[n] == pool))
        for pool in set(pools.values())
    }
    units = {name: sizes[name] // unit[pools[name]] for name in pools}
    return rd.Values(pools, reads, makes, units), described


def run(
    program: ActionProgram,
    wants: Wants,
    own: Sequence[Any],
    x: Sequence[Any],
    head_params: Sequence[Any],
    targets: Sequence[Any],
    head_tree: Any,
    h_tree: Any,
    t_tree: Any,
) -> tuple[Any, list[Any], list[Any], list[Any], list[Any]]:
    """The batch's mean loss and the gradients of ``own`` (each stage's weights, every
    leaf ``[stages, visits, layers a visit, ...]``), of the head's parameters, of ``x``
    and of ``targets`` (each leaf ``[microbatches, *batch axes' sizes, shard, ...]``);
    the ones ``wants`` leaves out are empty (NOTE [pipeline by actions])."""
    table = jnp.asarray(program.rounds.table)
    n_own, n_x, n_hp = len(own), len(x), len(head_params)
    batch = program.batch

    def per_device(table: Any, *flat: Any) -> list[Any]:
        own_b = [leaf[0] for leaf in flat[:n_own]]
        x_b = [_squeeze_shards(leaf, len(batch)) for leaf in flat[n_own : n_own + n_x]]
        hp_b = list(flat[n_own + n_x : n_own + n_x + n_hp])
        t_b = [_squeeze_shards(leaf, len(batch)) for leaf in flat[n_own + n_x + n_hp :]]
        body = _Body(program, wants, own_b, x_b, hp_b, t_b, head_tree, h_tree, t_tree)
        loss, d_own, d_hp, d_x, d_t = body.run(table[0])
        return [
            loss,
            *(g[None] for g in d_own),
            *d_hp,
            *(_expand_shards(g, len(batch)) for g in d_x),
            *(_expand_shards(g, len(batch)) for g in d_t),
        ]

    # outputs: the loss, the weights', head's, input's and targets' gradients
    n_out = (
        1,
        n_own,
        n_hp if wants.head else 0,
        n_x if wants.x else 0,
        len(targets) if wants.targets else 0,
    )
    args = [table, *own, *x, *head_params, *targets]
    stage_in = (0, *[0] * n_own, *[None] * (n_x + n_hp + len(targets)))
    stage_out = (None, *[0] * n_own, *[None] * (sum(n_out) - 1 - n_own))

    def nested(level: int) -> Callable[..., list[Any]]:
        """The region over batch axis ``level`` (its dimension ``1 + level`` of the
        microbatched values), the innermost running the body."""
        if level == len(batch):
            return per_device
        dim = 1 + level
        ins = (None, *[None] * n_own, *[dim] * n_x, *[None] * n_hp, *[dim] * len(targets))
        outs = (None, *[None] * (n_own + n_out[2]), *[dim] * (n_out[3] + n_out[4]))

        def region(*blocks: Any) -> list[Any]:
            return in_region(
                nested(level + 1),
                blocks,
                axis_name=batch[level],
                mesh=program.mesh,
                in_dims=ins,
                out_dims=outs,
                name=f"pipeline_shards_{batch[level]}",
            )

        return region

    outs = in_region(
        nested(0),
        args,
        axis_name=program.axis,
        mesh=program.mesh,
        in_dims=stage_in,
        out_dims=stage_out,
        name="pipeline_stages",
    )
    it = iter(outs)
    loss = next(it)
    grads = [[next(it) for _ in range(n)] for n in n_out[1:]]
    return loss, *grads  # type: ignore[return-value]


def _squeeze_shards(leaf: Any, n: int) -> Any:
    """``[M, 1 x n, shard, ...]`` (a block of every batch axis) -> ``[M, shard, ...]``."""
    return jax.lax.squeeze(leaf, tuple(range(1, 1 + n))) if n else leaf


def _expand_shards(leaf: Any, n: int) -> Any:
    return jax.lax.expand_dims(leaf, tuple(range(1, 1 + n))) if n else leaf


@dataclasses.dataclass
class _Carry:
    """What the rounds carry: the pools, the gradients' accumulators, the loss."""

    pools: dict[Hashable, Any]
    d_own: list[Any]
    loss: Any
    d_hp: list[Any]
    d_x: list[Any]
    d_t: list[Any]


@dataclasses.dataclass
class _Out:
    """What a round's branch gives back (NOTE [pipeline by actions]): the values it made,
    by name (zeros where it made none: the spare slot takes them), the weight gradients
    and head's to add, the loss's, the input's and targets' gradients, what it sends."""

    made: dict[str, list[Any]]
    d_own: list[Any]
    loss: Any
    d_hp: list[Any]
    d_x: list[Any]
    d_t: list[Any]
    send: list[Any]


for _cls in (_Carry, _Out):
    jax.tree_util.register_dataclass(
        _cls, data_fields=[f.name for f in dataclasses.fields(_cls)], meta_fields=[]
    )


class _Body:
    """The per-device body (NOTE [pipeline by actions]) on one device's blocks.

    NOTE [pipeline branches]: a branch of the round's ``lax.switch`` reads the pools but
    never writes them; it returns what it made (:class:`_Out`) and the round writes it
    after the switch, into the slots the table gives (the spare slot for what the
    branch did not make). XLA's conditional gives its results buffers of their own:
    pools passed through a branch would be copied at every round, and held twice.
    """

    def __init__(
        self,
        program: ActionProgram,
        wants: Wants,
        own: list[Any],
        x: list[Any],
        head_params: list[Any],
        targets: list[Any],
        head_tree: Any,
        h_tree: Any,
        t_tree: Any,
    ):
        self.p, self.wants = program, wants
        self.own, self.x, self.hp, self.targets = own, x, head_params, targets
        self.head_tree, self.h_tree, self.t_tree = head_tree, h_tree, t_tree
        self.fields = {name: k for k, name in enumerate(program.rounds.fields)}
        self.scale = 1.0 / (program.microbatches * program.shards)
        # every value a branch makes: the actions' and the gradient the head starts
        made = {n for names in program.values.makes.values() for n in names}
        self.made = sorted({*made, "ct"})
        # what the weights alone give, once for every visit, before the rounds
        self.fixed = jax.vmap(program.passes.fixed)(own)

    # --- reading values ---

    def _col(self, row: Any, name: str) -> Any:
        return row[self.fields[name]]

    def _read(self, carry: _Carry, row: Any, prefix: str, name: str, m: Any) -> list[Any]:
        pool = carry.pools[self.p.values.pools[name]]
        start = self._col(row, f"{prefix}:{name}")
        run = jax.lax.dynamic_slice_in_dim(pool, jnp.maximum(start, 0), self.p.values.length(name))
        kept = _unpack(run, self.p.shapes[name])
        if name != "in":
            return kept
        given = [jax.lax.dynamic_index_in_dim(leaf, m, 0, False) for leaf in self.x]
        return [jax.lax.select(start < 0, g, k) for g, k in zip(given, kept, strict=True)]

    def _fixed(self, v: Any) -> list[Any]:
        """The weights' own values of visit ``v`` (NOTE [pipeline passes])."""
        if self.p.visits == 1:
            return [leaf[0] for leaf in self.fixed]
        return [jax.lax.dynamic_index_in_dim(leaf, v, 0, False) for leaf in self.fixed]

    def _vjp(
        self, carry: _Carry, row: Any, prefix: str, m: Any, fixed: list[Any], piece: str
    ) -> list[Any]:
        """Every residual a backward piece needs: kept, recomputed from the input, or
        (the others) zeros XLA drops."""
        passes = self.p.passes
        names = self.p.values.reads[piece]
        if self.p.saves is Saves.INPUTS and piece != "W":
            _, vjp = passes.forward(fixed, self._read(carry, row, prefix, "in", m))
            return vjp
        h = self._read(carry, row, prefix, "in", m) if "in" in names else self._zeros_h()
        stored = []
        kept = [i for i, k in enumerate(passes.kept) if k]
        letter = "s" if self.p.saves is Saves.INPUTS else "r"
        for i, aval in zip(kept, passes.residual_avals, strict=True):
            name = f"{letter}{i}"
            if name in names:
                stored += self._read(carry, row, prefix, name, m)
            else:
                stored.append(jnp.zeros(aval.shape, aval.dtype))
        return passes.vjp_of(fixed, h, stored)

    def _zeros_h(self) -> list[Any]:
        return [jnp.zeros(leaf.shape[1:], leaf.dtype) for leaf in self.x]

    def _zeros_of(self, name: str) -> list[Any]:
        return [jnp.zeros(shape, dtype) for shape, dtype in self.p.shapes[name]]

    def _nothing(self) -> _Out:
        """A branch's results before its actions: nothing made, nothing to add."""
        return _Out(
            made={name: self._zeros_of(name) for name in self.made},
            d_own=[jnp.zeros(leaf.shape[1:], leaf.dtype) for leaf in self.own],
            loss=jnp.zeros((), jnp.float32),
            d_hp=[jnp.zeros_like(leaf) for leaf in self.hp] if self.wants.head else [],
            d_x=self._zeros_h() if self.wants.x else [],
            d_t=[jnp.zeros(leaf.shape[1:], leaf.dtype) for leaf in self.targets]
            if self.wants.targets
            else [],
            send=self._zeros_h(),
        )

    # --- the actions ---

    def forward(self, carry: _Carry, row: Any, out: _Out, head: bool) -> None:
        m, v = self._col(row, "m"), self._col(row, "v")
        fixed = self._fixed(v)
        h, vjp = self.p.passes.forward(fixed, self._read(carry, row, "c", "in", m))
        if self.p.saves is Saves.ACTIVATIONS:
            for name, leaf in zip(self.p.values.makes["F"], self.p.passes.stored(vjp), strict=True):
                out.made[name] = [leaf]
        if head:
            self._head(out, m, h)
        else:
            out.send = h

    def _head(self, out: _Out, m: Any, h: list[Any]) -> None:
        hp = jax.tree.unflatten(self.head_tree, self.hp)
        t = jax.tree.unflatten(
            self.t_tree, [jax.lax.dynamic_index_in_dim(leaf, m, 0, False) for leaf in self.targets]
        )
        loss, pullback = jax.vjp(self.p.head, hp, jax.tree.unflatten(self.h_tree, h), t)
        d_hp, d_h, d_t = pullback(jnp.asarray(self.scale, loss.dtype))
        out.loss = loss.astype(jnp.float32)
        out.made["ct"] = jax.tree.leaves(d_h)
        if self.wants.head:
            out.d_hp = jax.tree.leaves(d_hp)
        if self.wants.targets:
            out.d_t = jax.tree.leaves(d_t)

    def backward(self, carry: _Carry, row: Any, out: _Out, split: bool) -> None:
        m, v = self._col(row, "m"), self._col(row, "v")
        fixed = self._fixed(v)
        vjp = self._vjp(carry, row, "c", m, fixed, "I" if split else "B")
        ct = self._read(carry, row, "c", "ct", m)
        if split:
            d_h, q = self.p.passes.input_gradient(vjp, ct)
            made = list(self.p.values.makes["I"])
            for name, leaf in zip(made, q, strict=False):
                out.made[name] = [leaf]
            for name in made[len(q) :]:  # the residuals the weight gradient reads (inputs saved)
                out.made[name] = [vjp[int(name[1:])]]
        else:
            d_w, d_h = self.p.passes.backward(vjp, ct)
            out.d_own = d_w
        if self.wants.x:
            out.d_x = d_h
        out.send = d_h

    def weight(self, carry: _Carry, row: Any, out: _Out) -> None:
        m, v = self._col(row, "wm"), self._col(row, "wv")
        fixed = self._fixed(v)
        vjp = self._vjp(carry, row, "w", m, fixed, "W")
        names = self.p.values.reads["W"]
        ct = self._read(carry, row, "w", "ct", m) if "ct" in names else self._zeros_h()
        q = [self._read(carry, row, "w", f"q{j}", m)[0] for j in range(len(self.p.passes.q_avals))]
        out.d_own = self.p.passes.weight_gradient(vjp, ct, q)

    # --- the rounds ---

    def _branch(self, code: int) -> Callable[[_Carry, Any], _Out]:
        def branch(carry: _Carry, row: Any) -> _Out:
            out = self._nothing()
            if code in (rd.WEIGHT, rd.FORWARD_WEIGHT, rd.HEAD_WEIGHT, rd.INPUT_WEIGHT):
                self.weight(carry, row, out)
            if code in (rd.FORWARD, rd.FORWARD_WEIGHT, rd.HEAD, rd.HEAD_WEIGHT):
                self.forward(carry, row, out, head=code in (rd.HEAD, rd.HEAD_WEIGHT))
            elif code in (rd.BACKWARD, rd.INPUT, rd.INPUT_WEIGHT):
                self.backward(carry, row, out, split=code != rd.BACKWARD)
            like = self._nothing()
            return jax.tree.map(lambda a, b: a.astype(b.dtype), out, like)

        return branch

    def _round(self, carry: _Carry, row: Any, pairs: Sequence[tuple[int, int]] | None) -> _Carry:
        codes = self.p.rounds.codes
        index = np.searchsorted(codes, np.arange(max(codes) + 1)).clip(0, len(codes) - 1)
        code = self._col(row, "code")
        out = jax.lax.switch(
            jnp.asarray(index, jnp.int32)[code], [self._branch(c) for c in codes], carry, row
        )
        pools = dict(carry.pools)
        for name, value in out.made.items():  # NOTE [pipeline branches]
            self._write(pools, name, self._col(row, f"mk:{name}"), value)
        if pairs:
            received = [jax.lax.ppermute(s, self.p.axis, list(pairs)) for s in out.send]
            self._write(pools, "in", self._col(row, "recv"), received)
        weighs = (rd.WEIGHT, rd.FORWARD_WEIGHT, rd.HEAD_WEIGHT, rd.INPUT_WEIGHT)
        has_w = jnp.isin(code, jnp.asarray(weighs))
        v = jnp.where(has_w, self._col(row, "wv"), self._col(row, "v"))
        heads = jnp.isin(code, jnp.asarray((rd.HEAD, rd.HEAD_WEIGHT)))
        count = self.p.microbatches
        return _Carry(
            pools=pools,
            d_own=[_add_at(acc, v, g) for acc, g in zip(carry.d_own, out.d_own, strict=True)],
            loss=carry.loss + out.loss,
            d_hp=[a + g for a, g in zip(carry.d_hp, out.d_hp, strict=True)],
            d_x=[
                jax.lax.dynamic_update_index_in_dim(acc, g, self._col(row, "dx"), 0)
                for acc, g in zip(carry.d_x, out.d_x, strict=True)
            ],
            d_t=[
                jax.lax.dynamic_update_index_in_dim(
                    acc, g, jnp.where(heads, self._col(row, "m"), count), 0
                )
                for acc, g in zip(carry.d_t, out.d_t, strict=True)
            ],
        )

    def _write(self, pools: dict[Hashable, Any], name: str, start: Any, value: list[Any]) -> None:
        key = self.p.values.pools[name]
        run = _pack(value, pools[key], self.p.values.length(name))
        pools[key] = jax.lax.dynamic_update_slice_in_dim(pools[key], run, start, 0)

    def run(self, table: Any) -> tuple[Any, list[Any], list[Any], list[Any], list[Any]]:
        p = self.p
        count = p.microbatches
        pools = {}
        for key, size in p.rounds.pool_sizes.items():
            names = [n for n in p.values.names if p.values.pools[n] == key]
            spare = max(p.values.length(n) for n in names)
            first = p.shapes[names[0]]
            unit = sum(math.prod(shape) for shape, _ in first) // p.values.length(names[0])
            pools[key] = jnp.zeros((size + spare, unit), first[0][1])
        # the input's and targets' gradients: a row per microbatch and a spare one
        carry = _Carry(
            pools=pools,
            d_own=[jnp.zeros_like(leaf) for leaf in self.own],
            loss=jnp.zeros((), jnp.float32),
            d_hp=[jnp.zeros_like(leaf) for leaf in self.hp] if self.wants.head else [],
            d_x=[jnp.zeros((count + 1, *leaf.shape[1:]), leaf.dtype) for leaf in self.x]
            if self.wants.x
            else [],
            d_t=[jnp.zeros((count + 1, *leaf.shape[1:]), leaf.dtype) for leaf in self.targets]
            if self.wants.targets
            else [],
        )
        at = 0
        for body, trips in p.rounds.segments:  # NOTE [pipeline rounds]: a loop each

            def rounds(carry: _Carry, rows: Any, body: Any = body) -> tuple[_Carry, None]:
                for k, pairs in enumerate(body):
                    carry = self._round(carry, rows[k], pairs)
                return carry, None

            size = len(body) * trips
            rows = table[at : at + size].reshape(trips, len(body), table.shape[-1])
            carry, _ = jax.lax.scan(rounds, carry, rows)
            at += size
        every = (p.axis, *p.batch)
        loss = jax.lax.psum(carry.loss, every) / (count * p.shards)
        d_own = [jax.lax.psum(g, p.batch) if p.batch else g for g in carry.d_own]
        d_hp = [jax.lax.psum(g, every) for g in carry.d_hp]
        d_x = [jax.lax.psum(g[:count], p.axis) for g in carry.d_x]
        d_t = [jax.lax.psum(g[:count], p.axis) for g in carry.d_t]
        return loss, d_own, d_hp, d_x, d_t


def _unpack(run: Any, shapes: Sequence[tuple[tuple[int, ...], Any]]) -> list[Any]:
    """A pool's run ``[units, unit]`` as the value's leaves."""
    flat = run.reshape(-1)
    leaves, at = [], 0
    for shape, _ in shapes:
        n = math.prod(shape)
        leaves.append(flat[at : at + n].reshape(shape))
        at += n
    return leaves


def _pack(value: Sequence[Any], pool: Any, length: int) -> Any:
    """A value's leaves as a run of ``pool``'s units."""
    flat = jnp.concatenate([v.astype(pool.dtype).reshape(-1) for v in value])
    return flat.reshape(length, pool.shape[1])


def _add_at(acc: Any, v: Any, grad: Any) -> Any:
    """``acc`` with ``grad`` added to its visit ``v``."""
    if acc.shape[0] == 1:
        return acc + grad.astype(acc.dtype)[None]
    now = jax.lax.dynamic_index_in_dim(acc, v, 0, False)
    return jax.lax.dynamic_update_index_in_dim(acc, now + grad.astype(acc.dtype), v, 0)
