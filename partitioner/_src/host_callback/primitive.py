"""``id_tap_p``: the identity on its operands, with a tap on the way (seed 003).

The primitive's params are one :class:`TapParams` (the :class:`Tap`: the tap
function and its Python kwargs, compared by identity so any objects may ride
along; the transformations applied so far). Its effect is *ordered* and
*shardable*: XLA may partition the program around it, and taps keep program and
call order (the ordered-effect token, NOTE [device tap order] in ``receiver.py``).

Transformation rules (the seed's, names kept): ``vmap`` taps the batched value
with ``'batch'`` appended and the tapped leaves' ``batch_dims=``; ``jvp`` taps the primals as before
and the tangents with ``'jvp'``; transposing a tangent tap taps the cotangents
with ``'transpose'`` appended, so ``grad`` shows ``('jvp', 'transpose')``.

NOTE [taps under checkpoint]: the work ``jax.checkpoint`` recomputes in the
backward pass is work the user asked to watch, so a forward tap inside it runs
again there (the 2024 module's behaviour). jax's partial evaluation alone would
run it once and save its outputs (effectful equations are never recomputed);
:func:`remat` keeps it in the forward pass and stages a copy of it with
the recomputation, unless the checkpoint policy saves its outputs.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from .. import jax_private as jp
from ..trace.params import PrimitiveParams
from . import receiver


class TapEffect(jp.Effect):
    """The ordered, shardable effect of a tap (and of an ordered ``call``)."""

    def __str__(self) -> str:
        return "Tap"


tap_effect = TapEffect()


#: How the tap function is called (NOTE [calling conventions] in ``api.py``).
POSITIONAL = "positional"  # func(arg, transforms, **kwargs): the 2021-2024 module
KEYWORD = "keyword"  # func(arg, **kwargs), transforms= when transformed: the seed


def calling_convention(func: Callable[..., Any]) -> tuple[str, frozenset[str] | None]:
    """``(convention, named)`` read off ``func``'s signature.

    Positional when ``func`` takes a second positional argument without a default
    (or ``*args``); keyword otherwise, or when the signature cannot be read.
    ``named``: the keywords ``func`` names, with ``"**"`` when it takes
    ``**kwargs`` (None: its signature cannot be read), so the keyword convention
    passes ``transforms=`` and ``batch_dims=`` only to a function that takes them.
    """
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return KEYWORD, None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    second_required = len(positional) >= 2 and positional[1].default is inspect.Parameter.empty
    if second_required or (var_positional and len(positional) <= 1):
        return POSITIONAL, None
    names = {p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.VAR_KEYWORD)}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        names.add("**")
    return KEYWORD, frozenset(names)


@dataclasses.dataclass(frozen=True, eq=False)
class Tap:
    """What to call on the host, and how (NOTE [calling conventions] in ``api.py``).

    Compared by identity (``eq=False``): kwargs may hold any Python objects,
    hashable or not, and two ``id_tap`` calls are two taps.

    Attributes:
        func, kwargs: the tap function and the Python keywords it also gets.
        arg_treedef: the tapped pytree's structure.
        with_device: pass ``device=``.
        per_shard: with ``with_device``, one call per device with its shard (else
            one call with the whole value on device ``device_index``).
        device_index: the program's device that runs a whole-value tap.
        key_impls: per tapped leaf, the PRNG implementation of a typed key leaf
            (its key data is what crosses to the host), else None.
        convention, named: from :func:`calling_convention`.
    """

    func: Callable[..., Any]
    kwargs: dict[str, Any]
    arg_treedef: Any
    with_device: bool = False
    per_shard: bool = False
    device_index: int = 0
    key_impls: tuple[Any, ...] = ()
    convention: str = KEYWORD
    named: frozenset[str] | None = None

    def site(
        self, transforms: tuple[str, ...], batch_dims: Any, device: Any = None
    ) -> Callable[[list[np.ndarray]], receiver.TapItem]:
        """The maker of queue items for one place in a program: ``make(host_arrays)``.

        Everything but the arrays is settled here, once per place (per lowering),
        so a tap's callback only copies its arrays and queues one call (NOTE [tap
        speed] in ``receiver.py``). ``batch_dims``: what the convention shows,
        :meth:`TapParams.shown_batch_dims`.
        """
        args, extra = self._convention(transforms, batch_dims)
        if self.with_device:
            extra["device"] = device
        func, kwargs = self.func, {**extra, **self.kwargs}
        unflatten = self.arg_treedef.unflatten
        if any(impl is not None for impl in self.key_impls):
            unflatten = self._with_keys
        item = receiver.TapItem

        def make(arrays: list[np.ndarray]) -> receiver.TapItem:
            nbytes = arrays[0].nbytes if len(arrays) == 1 else sum(a.nbytes for a in arrays)
            return item(lambda: func(unflatten(arrays), *args, **kwargs), nbytes)

        return make

    def item(
        self,
        arrays: list[np.ndarray],
        transforms: tuple[str, ...],
        batch_dims: Any,
        device: Any = None,
    ) -> receiver.TapItem:
        """One queue item (for a place that taps once: eagerly): ``site(...)(arrays)``."""
        return self.site(transforms, batch_dims, device)(arrays)

    def _convention(
        self, transforms: tuple[str, ...], batch_dims: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments after ``arg`` and the keywords added (NOTE [calling conventions])."""
        if self.convention == POSITIONAL:
            return (_positional_transforms(transforms, batch_dims),), {}
        # The seed passed transforms= and batch_dims= when a transformation applied;
        # a function naming ``transforms`` always gets it; one that cannot take a
        # keyword is not given it.
        named = self.named

        def takes(keyword: str) -> bool:
            return named is None or keyword in named or "**" in named

        extra: dict[str, Any] = {}
        if (transforms and takes("transforms")) or (named is not None and "transforms" in named):
            extra["transforms"] = transforms
        if batch_dims is not None and takes("batch_dims"):
            extra["batch_dims"] = batch_dims
        return (), extra

    def _with_keys(self, arrays: list[Any]) -> Any:
        arrays = [
            a if impl is None else jax.random.wrap_key_data(a, impl=impl)
            for a, impl in zip(arrays, self.key_impls, strict=True)
        ]
        return self.arg_treedef.unflatten(arrays)

    def __repr__(self) -> str:
        name = getattr(self.func, "__qualname__", repr(self.func))
        return f"Tap({name}{', with_device' if self.with_device else ''})"


def _positional_transforms(
    transforms: tuple[str, ...], levels: tuple[tuple[int | None, ...], ...]
) -> tuple[Any, ...]:
    """The 2021-2024 module's ``transforms``: ``('batch', {'batch_dims': ...})`` entries.

    Each ``'batch'`` shows its own ``vmap`` level's dims of the tapped leaves
    (``levels``, in the order applied), as that module recorded them.
    """
    per_level = iter(levels)
    return tuple(
        ("batch", {"batch_dims": next(per_level)}) if t == "batch" else t for t in transforms
    )


id_tap_p = jp.Primitive("id_tap")
id_tap_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class TapParams(PrimitiveParams):
    """The parameters of one ``id_tap_p`` equation.

    Attributes:
        tap: the :class:`Tap`.
        nr_untapped: how many trailing operands (``result=``) pass by untapped.
        transforms: the transformations applied so far, outermost last.
        batch_levels: per ``'batch'`` in ``transforms`` (the order applied), the
            tapped operands' batch dims at that ``vmap`` level (the 2021-2024
            module's record, one dict per level). ``result=`` operands pass by
            and are not recorded: the tap function never sees them.

    Invariants (checked at construction): ``nr_untapped >= 0``; ``transforms`` a
    tuple of names; one ``batch_levels`` entry per ``'batch'``.
    """

    primitive: ClassVar[Any] = id_tap_p

    tap: Tap
    nr_untapped: int
    transforms: tuple[str, ...] = ()
    batch_levels: tuple[tuple[int | None, ...], ...] = ()

    def check(self) -> None:
        if not isinstance(self.tap, Tap):
            raise TypeError(f"internal error: id_tap params need a Tap, got {self.tap!r}")
        if not isinstance(self.nr_untapped, int) or self.nr_untapped < 0:
            raise ValueError(f"internal error: id_tap nr_untapped={self.nr_untapped!r}")
        object.__setattr__(self, "transforms", tuple(self.transforms))
        if not all(isinstance(t, str) for t in self.transforms):
            raise TypeError(f"internal error: id_tap transforms={self.transforms!r}")
        object.__setattr__(self, "batch_levels", tuple(map(tuple, self.batch_levels)))
        if len(self.batch_levels) != self.transforms.count("batch"):
            raise ValueError(
                f"internal error: id_tap batch_levels={self.batch_levels!r} for "
                f"transforms={self.transforms!r}"
            )

    def with_transform(self, name: str) -> TapParams:
        """A copy with ``name`` appended to the transforms."""
        return self.replace(transforms=(*self.transforms, name))

    def tapped(self, args: Sequence[Any]) -> Sequence[Any]:
        """The operands passed to the tap function (the last ``nr_untapped`` are not)."""
        return args[: len(args) - self.nr_untapped]

    def shown_batch_dims(self) -> Any:
        """The batch dims as the tap function's convention shows them.

        The seed's keyword convention: one ``batch_dims``, the outermost ``vmap``'s
        dims of the tapped leaves (NOTE [calling conventions]; the 2020 module
        listed the ``result=`` operands' too, its successor did not), None when no
        ``vmap`` applied; the 2021-2024 positional one: ``batch_levels``, one
        entry per ``vmap``.
        """
        if self.tap.convention != KEYWORD:
            return self.batch_levels
        return self.batch_levels[-1] if self.batch_levels else None


def host_copy(x: Any) -> np.ndarray:
    """A host array the tap owns (device buffers may be reused or donated after the call).

    jaxlib hands host callbacks fresh numpy arrays that own their memory: those are
    kept as they are, which saves a copy per tap (a third of a 1 MiB tap's time).
    """
    if isinstance(x, np.ndarray) and x.flags.owndata:
        return x
    return np.array(x, copy=True)


# --- evaluation ---


def impl(*args: Any, **kwargs: Any) -> Sequence[Any]:
    p = TapParams.of(kwargs)
    # An eager tap comes after the taps of every program launched before it.
    rec = receiver.current()
    if not rec.in_consumer():
        jax.effects_barrier()
    values = p.tapped(args)
    tap, dims = p.tap, p.shown_batch_dims()
    if not tap.with_device:
        rec.sequencer.put(tap.item([host_copy(v) for v in values], p.transforms, dims))
        return args
    by_device = _shards_by_device(values)
    if tap.per_shard:
        for device, shards in by_device:
            rec.sequencer.put(tap.item(shards, p.transforms, dims, device))
        return args
    devices = [d for d, _ in by_device]
    device = devices[tap.device_index] if tap.device_index < len(devices) else devices[0]
    rec.sequencer.put(tap.item([host_copy(v) for v in values], p.transforms, dims, device))
    return args


def _shards_by_device(values: Sequence[Any]) -> list[tuple[Any, list[np.ndarray]]]:
    """``(device, each value's shard there)`` for every device holding one of ``values``.

    A value not on a device (a numpy array, a Python scalar) is whole on each; when
    no value is on a device, the default device holds them all.
    """
    on_device = [v for v in values if isinstance(v, jax.Array)]
    devices = sorted(
        {s.device for v in on_device for s in v.addressable_shards}, key=lambda d: d.id
    )
    if not devices:
        return [(jax.local_devices()[0], [host_copy(v) for v in values])]
    found = []
    for device in devices:
        shards = []
        for v in values:
            local = (
                [s.data for s in v.addressable_shards if s.device == device]
                if isinstance(v, jax.Array)
                else []
            )
            shards.append(host_copy(local[0] if local else v))
        found.append((device, shards))
    return found


def abstract_eval(*avals: Any, **params: Any) -> tuple[list[Any], set[Any]]:
    del params
    return list(avals), {tap_effect}


# --- batching ---


def batcher(
    args: Sequence[Any], dims: Sequence[int | None], **kwargs: Any
) -> tuple[Sequence[Any], Sequence[int | None]]:
    p = TapParams.of(kwargs)
    tapped = tuple(p.tapped(dims))
    if all(d is None for d in tapped):
        # Only ``result=`` operands are batched: the tap sees its value once, as it
        # is, and records no ``vmap`` (as the 2021-2024 module, whose tap did not
        # take the ``result=`` operands at all).
        return p.bind(*args), dims
    batched = p.replace(transforms=(*p.transforms, "batch"), batch_levels=(*p.batch_levels, tapped))
    return batched.bind(*args), dims


# --- jvp ---


def jvp(
    primals: Sequence[Any], tangents: Sequence[Any], **kwargs: Any
) -> tuple[Sequence[Any], Sequence[Any]]:
    # Two taps, so partial evaluation keeps the primal one in the forward pass and
    # stages the tangent one (its transpose taps the cotangents). The tangents of
    # ``result=`` operands go through the tangent tap untapped (as the seed's), so
    # their cotangents reach its transpose: a tap whose ``result=`` is used shows
    # its (zero) cotangents, one whose outputs are all unused shows none. Symbolic
    # zeros and float0 tangents (of integers, PRNG keys) pass by.
    p = TapParams.of(kwargs)
    primals_out = p.bind(*primals)
    n = len(primals) - p.nr_untapped
    # float0 tangents cannot cross to the host: the tap sees False where they are
    # (as the 2024 module showed them).
    tapped_tangents = [_tappable(jp.instantiate_zeros(t)) for t in tangents[:n]]
    results = list(tangents[n:])
    through = [i for i, t in enumerate(results) if type(t) is not jp.Zero and not _is_float0(t)]
    tangent_p = p.with_transform("jvp").replace(nr_untapped=len(through))
    outs = tangent_p.bind(*tapped_tangents, *(results[i] for i in through))
    for k, i in enumerate(through):
        results[i] = outs[n + k]
    tapped_out = [t if _is_float0(t) else o for t, o in zip(tangents[:n], outs[:n], strict=True)]
    return primals_out, [*tapped_out, *results]


def _is_float0(t: Any) -> bool:
    dtype = getattr(t.aval if type(t) is jp.Zero else t, "dtype", None)
    return dtype == jax.dtypes.float0


def _tappable(t: Any) -> Any:
    return jax.numpy.zeros(t.shape, bool) if _is_float0(t) else t


# --- transpose ---


def transpose(cts: Sequence[Any], *args: Any, **kwargs: Any) -> Sequence[Any]:
    # Every operand of a tangent tap is linear: the identity's transpose is the
    # identity, tapped. When no cotangent flows back (the tap's result was
    # unused), there is nothing to see: no tap (as the 2024 module).
    del args
    if all(type(ct) is jp.Zero for ct in cts):
        return list(cts)
    cts = [jp.instantiate_zeros(ct) for ct in cts]
    return TapParams.of(kwargs).with_transform("transpose").bind(*cts)


# --- partial eval (remat) ---


def remat(
    saveable: Callable[..., Any], unks_in: Sequence[bool], inst_in: Sequence[bool], eqn: Any
) -> tuple[Any, Any, list[bool], list[bool], list[Any]]:
    # NOTE [taps under checkpoint]
    n = len(eqn.outvars)
    if any(unks_in):  # as jax's default: the whole tap is staged
        residuals = [
            v
            for v, unknown, inst in zip(eqn.invars, unks_in, inst_in, strict=True)
            if not unknown and not inst and not isinstance(v, jp.Literal)
        ]
        return None, eqn, [True] * n, [True] * n, residuals
    policy = jp.remat_policy(saveable(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params))
    if policy != "recompute":
        return eqn, None, [False] * n, [False] * n, []
    again = eqn.replace(outvars=[jp.DropVar(v.aval) for v in eqn.outvars])
    residuals = [v for v in eqn.invars if not isinstance(v, jp.Literal)]
    return eqn, again, [False] * n, [False] * n, residuals
