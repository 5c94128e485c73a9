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
(made on stage 0) over the stages. Each round ends with one ``lax.ppermute`` of
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
        head: ``head(head_params, h, targets) -> loss`` on a microbatch's shard.
        saves: what a forward keeps.
        mesh, axis, batch: the region's axes: the stages', then the batch axes.
        microbatches: ``M``.
        visits: each stage's visits (``R``; 1 for 1F1B and zero bubble).
    """

    passes: Passes
    rounds: rd.Rounds
    values: rd.Values
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


def values_of(passes: Passes, saves: Saves, h_avals: Sequence[Any], split: bool) -> rd.Values:
    """The values the rounds keep (NOTE [pipeline rounds]) for ``passes``: the input and
    the gradient received (``in``, ``ct``), each kept residual (``r<i>``), and, for a
    split backward, what the input gradient leaves its weight gradient (``q<j>``;
    saving inputs, the residuals it reads too, ``s<i>``)."""
    h_pool: Hashable = _key(h_avals)
    pools: dict[str, Hashable] = {"in": h_pool, "ct": h_pool}
    kept = [i for i, k in enumerate(passes.kept) if k]
    residuals = dict(zip(kept, passes.residual_avals, strict=True))
    from_input = passes.from_input

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
        pools.update({f"r{i}": _key([residuals[i]]) for i in kept})
    if not split:
        reads["B"] = tuple(named("B"))
        return rd.Values(pools, reads, makes)
    reads["I"] = tuple(named("I"))
    q = [f"q{j}" for j in range(len(passes.q_avals))]
    pools.update({name: _key([aval]) for name, aval in zip(q, passes.q_avals, strict=True)})
    recomputed = [n for n in named("W") if n.startswith("s")]
    pools.update({n: _key([residuals[int(n[1:])]]) for n in recomputed})
    makes["I"] = (*q, *recomputed)
    reads["W"] = (*named("W"), *q)
    return rd.Values(pools, reads, makes)


def _key(avals: Sequence[Any]) -> Hashable:
    """A pool's key: the shapes and dtypes of a value's leaves."""
    return tuple((tuple(a.shape), str(a.dtype)) for a in avals)


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

    n_out = (1, n_own, n_hp if wants.head else 0, n_x if wants.x else 0)
    n_out = (*n_out, len(targets) if wants.targets else 0)
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

    pools: dict[Hashable, list[Any]]
    d_own: list[Any]
    loss: Any
    d_hp: list[Any]
    d_x: list[Any]
    d_t: list[Any]


jax.tree_util.register_dataclass(
    _Carry, data_fields=["pools", "d_own", "loss", "d_hp", "d_x", "d_t"], meta_fields=[]
)


class _Body:
    """The per-device body (NOTE [pipeline by actions]) on one device's blocks."""

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
        count = program.microbatches
        self.scale = 1.0 / (count * program.shards)

    # --- reading and writing values ---

    def _col(self, row: Any, name: str) -> Any:
        return row[self.fields[name]]

    def _read(self, carry: _Carry, row: Any, prefix: str, name: str, m: Any) -> list[Any]:
        pool = carry.pools[self.p.values.pools[name]]
        slot = self._col(row, f"{prefix}:{name}")
        kept = [jax.lax.dynamic_index_in_dim(p, jnp.maximum(slot, 0), 0, False) for p in pool]
        if name != "in":
            return kept
        given = [jax.lax.dynamic_index_in_dim(leaf, m, 0, False) for leaf in self.x]
        return [jax.lax.select(slot < 0, g, k) for g, k in zip(given, kept, strict=True)]

    def _write(self, carry: _Carry, row: Any, prefix: str, name: str, value: list[Any]) -> None:
        key = self.p.values.pools[name]
        slot = self._col(row, f"{prefix}:{name}")
        carry.pools[key] = [
            jax.lax.dynamic_update_index_in_dim(p, v.astype(p.dtype), slot, 0)
            for p, v in zip(carry.pools[key], value, strict=True)
        ]

    def _weights(self, v: Any) -> list[Any]:
        if self.p.visits == 1:
            return [leaf[0] for leaf in self.own]
        return [jax.lax.dynamic_index_in_dim(leaf, v, 0, False) for leaf in self.own]

    def _add_weights(self, carry: _Carry, v: Any, grads: Sequence[Any]) -> None:
        carry.d_own = [
            jax.lax.dynamic_update_index_in_dim(
                acc, jax.lax.dynamic_index_in_dim(acc, v, 0, False) + g.astype(acc.dtype), v, 0
            )
            for acc, g in zip(carry.d_own, grads, strict=True)
        ]

    def _vjp(self, carry: _Carry, row: Any, prefix: str, m: Any, fixed: list[Any], piece: str) -> list[Any]:
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

    # --- the actions ---

    def forward(self, carry: _Carry, row: Any, head: bool) -> list[Any]:
        m, v = self._col(row, "m"), self._col(row, "v")
        fixed = self.p.passes.fixed(self._weights(v))
        out, vjp = self.p.passes.forward(fixed, self._read(carry, row, "c", "in", m))
        if self.p.saves is Saves.ACTIVATIONS:
            for name, leaf in zip(self.p.values.makes["F"], self.p.passes.stored(vjp), strict=True):
                self._write(carry, row, "c", name, [leaf])
        if not head:
            return out
        self._head(carry, row, m, out)
        return self._zeros_h()

    def _head(self, carry: _Carry, row: Any, m: Any, out: list[Any]) -> None:
        hp = jax.tree.unflatten(self.head_tree, self.hp)
        h = jax.tree.unflatten(self.h_tree, out)
        t = jax.tree.unflatten(
            self.t_tree, [jax.lax.dynamic_index_in_dim(leaf, m, 0, False) for leaf in self.targets]
        )
        loss, pullback = jax.vjp(self.p.head, hp, h, t)
        d_hp, d_h, d_t = pullback(jnp.asarray(self.scale, loss.dtype))
        carry.loss = carry.loss + loss.astype(carry.loss.dtype)
        self._write(carry, row, "c", "ct", jax.tree.leaves(d_h))
        if self.wants.head:
            carry.d_hp = [a + g for a, g in zip(carry.d_hp, jax.tree.leaves(d_hp), strict=True)]
        if self.wants.targets:
            carry.d_t = [
                jax.lax.dynamic_update_index_in_dim(acc, g.astype(acc.dtype), m, 0)
                for acc, g in zip(carry.d_t, jax.tree.leaves(d_t), strict=True)
            ]

    def backward(self, carry: _Carry, row: Any, split: bool) -> list[Any]:
        m, v = self._col(row, "m"), self._col(row, "v")
        fixed = self.p.passes.fixed(self._weights(v))
        piece = "I" if split else "B"
        vjp = self._vjp(carry, row, "c", m, fixed, piece)
        ct = self._read(carry, row, "c", "ct", m)
        if split:
            d_h, q = self.p.passes.input_gradient(vjp, ct)
            made = list(self.p.values.makes["I"])
            for name, leaf in zip(made, q, strict=False):
                self._write(carry, row, "c", name, [leaf])
            for name in made[len(q) :]:  # the residuals the weight gradient reads (inputs saved)
                self._write(carry, row, "c", name, [vjp[int(name[1:])]])
        else:
            d_w, d_h = self.p.passes.backward(vjp, ct)
            self._add_weights(carry, v, d_w)
        if self.wants.x:
            row_dx = self._col(row, "dx")
            carry.d_x = [
                jax.lax.dynamic_update_index_in_dim(acc, g.astype(acc.dtype), row_dx, 0)
                for acc, g in zip(carry.d_x, d_h, strict=True)
            ]
        return d_h

    def weight(self, carry: _Carry, row: Any) -> None:
        m, v = self._col(row, "wm"), self._col(row, "wv")
        fixed = self.p.passes.fixed(self._weights(v))
        vjp = self._vjp(carry, row, "w", m, fixed, "W")
        names = self.p.values.reads["W"]
        ct = self._read(carry, row, "w", "ct", m) if "ct" in names else self._zeros_h()
        q = [self._read(carry, row, "w", f"q{j}", m)[0] for j in range(len(self.p.passes.q_avals))]
        self._add_weights(carry, v, self.p.passes.weight_gradient(vjp, ct, q))

    # --- the rounds ---

    def _branch(self, code: int) -> Callable[[_Carry, Any], tuple[_Carry, list[Any]]]:
        def branch(carry: _Carry, row: Any) -> tuple[_Carry, list[Any]]:
            carry = dataclasses.replace(carry, pools=dict(carry.pools))
            if code in (rd.WEIGHT, rd.FORWARD_WEIGHT, rd.HEAD_WEIGHT, rd.INPUT_WEIGHT):
                self.weight(carry, row)
            if code in (rd.FORWARD, rd.FORWARD_WEIGHT):
                send = self.forward(carry, row, head=False)
            elif code in (rd.HEAD, rd.HEAD_WEIGHT):
                send = self.forward(carry, row, head=True)
            elif code == rd.BACKWARD:
                send = self.backward(carry, row, split=False)
            elif code in (rd.INPUT, rd.INPUT_WEIGHT):
                send = self.backward(carry, row, split=True)
            else:
                send = self._zeros_h()
            return carry, [s.astype(z.dtype) for s, z in zip(send, self._zeros_h(), strict=True)]

        return branch

    def _round(self, carry: _Carry, row: Any, pairs: Sequence[tuple[int, int]] | None) -> _Carry:
        codes = self.p.rounds.codes
        index = jnp.asarray(np.searchsorted(codes, np.arange(max(codes) + 1)).clip(0, len(codes) - 1))
        carry, send = jax.lax.switch(
            index[self._col(row, "code")], [self._branch(c) for c in codes], carry, row
        )
        if pairs:
            received = [jax.lax.ppermute(s, self.p.axis, list(pairs)) for s in send]
            carry = dataclasses.replace(carry, pools=dict(carry.pools))
            key = self.p.values.pools["in"]
            slot = self._col(row, "recv")
            carry.pools[key] = [
                jax.lax.dynamic_update_index_in_dim(p, r, slot, 0)
                for p, r in zip(carry.pools[key], received, strict=True)
            ]
        return carry

    def run(self, table: Any) -> tuple[Any, list[Any], list[Any], list[Any], list[Any]]:
        p = self.p
        count = p.microbatches
        pools = {
            key: [jnp.zeros((size + 1, *shape), dtype) for shape, dtype in key]  # type: ignore[misc]
            for key, size in p.rounds.pool_sizes.items()
        }
        # pools no value uses are still sized (the spare slot): keep them small
        carry = _Carry(
            pools=pools,
            d_own=[jnp.zeros_like(leaf) for leaf in self.own],
            loss=jnp.zeros((), jnp.float32),
            d_hp=[jnp.zeros_like(leaf) for leaf in self.hp] if self.wants.head else [],
            d_x=[jnp.zeros((count + 1, *leaf.shape[1:]), leaf.dtype) for leaf in self.x]
            if self.wants.x
            else [],
            d_t=[jnp.zeros_like(leaf) for leaf in self.targets] if self.wants.targets else [],
        )
        sends = p.rounds.sends
        even, odd = p.rounds.pairs

        def two_rounds(carry: _Carry, rows: Any) -> tuple[_Carry, None]:
            carry = self._round(carry, rows[0], even)
            return self._round(carry, rows[1], odd), None

        def one_round(carry: _Carry, row: Any) -> tuple[_Carry, None]:
            return self._round(carry, row, None), None

        if sends:
            pairs_of_rounds = table[:sends].reshape(sends // 2, 2, table.shape[-1])
            carry, _ = jax.lax.scan(two_rounds, carry, pairs_of_rounds)
        if table.shape[0] > sends:
            carry, _ = jax.lax.scan(one_round, carry, table[sends:])
        every = (p.axis, *p.batch)
        loss = jax.lax.psum(carry.loss, every) / (count * p.shards)
        d_own = [jax.lax.psum(g, p.batch) if p.batch else g for g in carry.d_own]
        d_hp = [jax.lax.psum(g, every) for g in carry.d_hp]
        d_x = [jax.lax.psum(g[:count], p.axis) for g in carry.d_x]
        d_t = [jax.lax.psum(g, every[:1]) for g in carry.d_t]
        return loss, d_own, d_hp, d_x, d_t
