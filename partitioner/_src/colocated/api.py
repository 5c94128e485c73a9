"""``colocated_python``: Python that runs where the shards live, asynchronously (seed 002).

A call checks its arguments, finds (or builds) the *specialized* function for their
shapes, dtypes and layouts, and hands the call to it (NOTE [colocated execution]
in ``runtime.py``). The first call of a specialization without ``out_specs_fn``
runs synchronously, to discover the output layout; a later call returns its
outputs as they are when the function is short (waiting is cheaper than a
promise), else promised outputs at once. Calls run on the calling thread's lane
(NOTE [colocated lanes]).

NOTE [specialization caches] (the seed's): looking up a specialization by its
input layouts compares shardings, which is slow, so each callable keeps two
caches for the same entries: one keyed by the *ids* of the arguments' shardings
(fast; valid while the entry keeps those sharding objects alive), one keyed by
the layouts themselves. A miss in the first and a hit in the second moves the
entry's id key to the new sharding objects. ``jax.clear_caches()`` empties both
(they are registered with jax); a callable that is garbage collected frees its
entries.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.backend import register_backend_cache

from .. import jax_private as jp
from ..distributed.arrays import host_local_view
from ..events import emit
from ..trace.arguments import Binding, call_leaves, flat_arguments
from .layout import OutputLayout, check_output, layout_from_outputs, layout_from_specs
from .runtime import PROMISES, describe_error, logger, on_worker, run_sync, submit

ShapeDtypeStructTree = Any

#: A colocated function's arguments: all dynamic, named as a call of it names them.
_ARGUMENTS = Binding("colocated_python")


@dataclasses.dataclass(frozen=True)
class Specialization:
    """What a callable is specialized to; each field can be given once."""

    in_specs_treedef: Any = None
    in_specs_leaves: tuple[jax.ShapeDtypeStruct, ...] | None = None
    out_specs_fn: Callable[..., ShapeDtypeStructTree] | None = None
    devices: tuple[jax.Device, ...] | None = None

    def update(
        self,
        *,
        in_specs: ShapeDtypeStructTree | None = None,
        out_specs_fn: Callable[..., ShapeDtypeStructTree] | None = None,
        devices: Sequence[jax.Device] | None = None,
    ) -> Specialization:
        """A copy with more fields given.

        Raises:
            ValueError: a field given again ("... already specified").
        """
        new = self
        if in_specs is not None:
            if self.in_specs_leaves is not None:
                raise ValueError("in_specs already specified")
            leaves, treedef = jax.tree_util.tree_flatten(in_specs)
            new = dataclasses.replace(new, in_specs_treedef=treedef, in_specs_leaves=tuple(leaves))
        if out_specs_fn is not None:
            if self.out_specs_fn is not None:
                raise ValueError("out_specs_fn already specified")
            if not callable(out_specs_fn):
                raise TypeError(f"out_specs_fn must be callable, got {out_specs_fn!r}")
            new = dataclasses.replace(new, out_specs_fn=out_specs_fn)
        if devices is not None:
            if self.devices is not None:
                raise ValueError("devices already specified")
            devices = tuple(devices)
            if not devices or not all(isinstance(d, jax.Device) for d in devices):
                raise ValueError(
                    f"devices must be a non-empty sequence of jax.Device, got {devices!r}"
                )
            new = dataclasses.replace(new, devices=devices)
        return new


def _spec_of(x: Any, where: str) -> jax.ShapeDtypeStruct:
    if not isinstance(x, jax.Array):
        raise ValueError(
            f"colocated_python only supports jax.Array as input and output, but {where} is "
            f"{type(x).__name__}"
        )
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)


def _placed(leaves: list[jax.Array]) -> list[jax.Array]:
    """Uncommitted arguments moved beside the committed ones, replicated (``leaves`` if none).

    Why: as with ``jax.jit``, an array made without a placement (optax's step
    count, ``jnp.zeros(())``) goes where the other arguments are, instead of
    putting the call on two device lists.
    """
    committed = [x for x in leaves if x.committed]
    if not committed or len(committed) == len(leaves):
        return leaves
    sharding = committed[0].sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        target: jax.sharding.Sharding = jax.sharding.NamedSharding(
            sharding.mesh, jax.sharding.PartitionSpec()
        )
    elif isinstance(sharding, jax.sharding.SingleDeviceSharding):
        target = sharding
    else:
        devices = np.array(jp.device_assignment_of(sharding))
        target = jax.sharding.NamedSharding(
            jax.sharding.Mesh(devices, ("colocated",)), jax.sharding.PartitionSpec()
        )
    return [x if x.committed else jax.device_put(x, target) for x in leaves]


def _device_list(leaves: Sequence[jax.Array]) -> tuple[jax.Device, ...] | None:
    """The one device list every argument uses (None without arguments).

    Raises:
        ValueError: arguments on different device lists.
    """
    found: dict[tuple[int, ...], tuple[jax.Device, ...]] = {}
    for x in leaves:
        devices = jp.device_assignment_of(x.sharding)
        found.setdefault(tuple(d.id for d in devices), devices)
    if len(found) > 1:
        raise ValueError(
            "colocated_python: all arguments must use the same device list, but got multiple "
            f"device lists: {sorted(found)}"
        )
    return next(iter(found.values()), None)


# --- one specialization: its output layout and its calls ---


class _Call:
    """One call between its caller and the worker running it (NOTE [colocated execution]).

    The worker hands the outputs to a caller still waiting for them; once the
    caller has promised them instead, the worker fulfils the promise.
    """

    __slots__ = ("lock", "ready", "outputs", "error", "promise_id")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready = threading.Lock()  # held until the worker hands the outputs over
        self.ready.acquire()
        self.outputs: list[jax.Array] | None = None
        self.error: BaseException | None = None
        self.promise_id: int | None = None


class _Specialized:
    """A callable specialized to one input layout (NOTE [colocated execution])."""

    def __init__(self, fun: Callable[..., Any], name: str, spec: Specialization) -> None:
        assert spec.devices is not None
        self.fun, self.name, self.spec = fun, name, spec
        self.layout: OutputLayout | None = None
        self._lock = threading.Lock()
        # The entry keeps its input shardings alive, so their ids stay valid cache keys.
        self.in_shardings = tuple(
            getattr(leaf, "sharding", None) for leaf in spec.in_specs_leaves or ()
        )
        self.global_mesh = _mesh_of(spec)
        # Over processes (each runs its block, assembled) or this process's alone.
        devices = set(spec.devices).union(*(s.device_set for s in self.in_shardings if s))
        self.spans = any(d.process_index != jax.process_index() for d in devices)
        # What the function's last run took, and what a promise of its outputs costs:
        # a call waits for a function shorter than that.
        self.run_s = 0.0
        self.promise_s = 0.0
        self.transferable = True  # False once the runtime refused to promise an output

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.spans:
            local_args, local_kwargs = jax.tree.map(host_local_view, (args, kwargs))
        else:  # this process's devices only: the arguments are their own local parts
            local_args, local_kwargs = args, kwargs
        if self.layout is None:
            discovered = self._set_layout(args, kwargs, local_args, local_kwargs)
            if discovered is not None:
                return discovered[0]
        layout = self.layout
        assert layout is not None
        if on_worker() or not self.transferable:
            # Nested in a colocated function (part of its call), or outputs no promise
            # can carry: run now, in call order.
            leaves = run_sync(lambda: self._run(local_args, local_kwargs, layout))
            return jax.tree_util.tree_unflatten(layout.treedef, layout.finish(leaves))
        return self._launch(local_args, local_kwargs, layout)

    def _run(self, local_args: Any, local_kwargs: Any, layout: OutputLayout) -> list[jax.Array]:
        start = time.perf_counter()
        try:
            return _checked(self.fun(*local_args, **local_kwargs), layout, self.name)
        finally:
            self.run_s = time.perf_counter() - start

    def _set_layout(
        self, args: Any, kwargs: Any, local_args: Any, local_kwargs: Any
    ) -> tuple[Any] | None:
        """The output layout, from out_specs_fn or from running this (first) call now.

        The call runs in call order on the caller's lane, without a lock held, so
        first calls from several threads run concurrently (the first to finish
        sets the layout).

        Returns:
            ``(outputs,)`` of the call when it ran to discover the layout, else None.
        """
        if self.spec.out_specs_fn is not None:
            with self._lock:
                if self.layout is None:
                    in_specs = jax.tree.map(lambda x: _spec_of(x, "an argument"), (args, kwargs))
                    specs = self.spec.out_specs_fn(*in_specs[0], **in_specs[1])
                    self._install(layout_from_specs(specs, self.spans))
            return None

        def discover() -> Any:
            start = time.perf_counter()
            try:
                return self.fun(*local_args, **local_kwargs)
            finally:
                self.run_s = time.perf_counter() - start

        outputs = run_sync(discover)
        found = layout_from_outputs(outputs, self.global_mesh, self.spans)
        with self._lock:
            if self.layout is None:
                self._install(found)
        leaves = jax.tree.leaves(outputs)
        if self.spans:
            leaves = found.assemble(found.to_local(leaves))
        return (jax.tree_util.tree_unflatten(found.treedef, leaves),)

    def _install(self, found: OutputLayout) -> None:
        self.layout = found
        self.promise_s = _PROMISE_PER_SHARD_S * sum(
            len(s.sharding.addressable_devices) for s in found.local_structs
        )
        emit("colocated_specialize", name=self.name)

    def _launch(self, local_args: Any, local_kwargs: Any, layout: OutputLayout) -> Any:
        """NOTE [colocated execution]: queue the function; wait for it, or promise its outputs."""
        call = _Call()
        structs = layout.local_structs

        def run() -> None:
            try:
                blocks, error = self._run(local_args, local_kwargs, layout), None
            except BaseException as e:  # surfaces where an output is consumed
                blocks, error = [], e
            with call.lock:
                if call.promise_id is None:  # the caller is still waiting: hand them over
                    call.outputs, call.error = blocks, error
                    call.ready.release()
                    return
            if error is not None:
                blocks = self._error_blocks(layout, error)
            else:
                blocks = layout.to_local(blocks)
            PROMISES.fulfil(call.promise_id, blocks)

        submit(run)
        done = self.run_s < self.promise_s and call.ready.acquire(timeout=self.promise_s)
        with call.lock:
            if not done:
                done = call.ready.acquire(blocking=False)  # handed over just now
            if not done:
                try:
                    promise_id, pending = PROMISES.promise(structs)
                except jax.errors.JaxRuntimeError as e:  # a dtype no transfer carries
                    self._not_transferable(layout, e)
                else:
                    call.promise_id = promise_id
                    return jax.tree_util.tree_unflatten(layout.treedef, layout.assemble(pending))
        if not done:
            call.ready.acquire()  # the function's outputs, as they are
        if call.error is not None:
            return self._errors(layout, call.error)
        assert call.outputs is not None
        return jax.tree_util.tree_unflatten(layout.treedef, layout.finish(call.outputs))

    def _error_blocks(self, layout: OutputLayout, error: BaseException) -> list[jax.Array]:
        """This process's blocks of outputs that raise ``error`` where consumed.

        A function without outputs has nothing to carry the error: it is logged.
        """
        message = describe_error(self.name, error)
        if not layout.local_structs:
            logger.error("%s (it has no outputs to carry the error)", message)
        return PROMISES.errors(layout.local_structs, message)

    def _errors(self, layout: OutputLayout, error: BaseException) -> Any:
        """Outputs that raise ``error`` where consumed."""
        try:
            blocks = self._error_blocks(layout, error)
        except jax.errors.JaxRuntimeError:  # no error array of this dtype: raise it here
            raise error from None
        return jax.tree_util.tree_unflatten(layout.treedef, layout.assemble(blocks))

    def _not_transferable(self, layout: OutputLayout, e: BaseException) -> None:
        """From now on, run this function's calls synchronously (logged once)."""
        self.transferable = False
        logger.warning(
            "colocated_python function %r: its outputs (%s) cannot be promised (%s); its "
            "calls run synchronously",
            self.name,
            ", ".join(str(s.dtype) for s in layout.local_structs),
            e,
        )


#: What promising one shard costs (about 60 us measured here, NOTE [colocated execution]).
_PROMISE_PER_SHARD_S = 60e-6


def _mesh_of(spec: Specialization) -> Any:
    """The arguments' mesh (for a job of several processes), if they have one."""
    for leaf in spec.in_specs_leaves or ():
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding):
            return sharding.mesh
    return None


def _checked(outputs: Any, layout: OutputLayout, name: str) -> list[jax.Array]:
    """The outputs' leaves, if they are what the layout says this process returns.

    Raises:
        ValueError: another pytree, a leaf that is not a jax.Array, or another
            shape or dtype than the output specs give for this process's block.
    """
    leaves, treedef = jax.tree_util.tree_flatten(outputs)
    if treedef != layout.treedef:
        raise ValueError(
            f"colocated_python function {name!r} returned {treedef}, but its output specs "
            f"say {layout.treedef}"
        )
    for i, (leaf, local) in enumerate(zip(leaves, layout.local_shapes, strict=True)):
        check_output(leaf, i)
        if tuple(leaf.shape) != local or leaf.dtype != layout.dtypes[i]:
            raise ValueError(
                f"colocated_python function {name!r}: output {i} is {leaf.dtype}{list(leaf.shape)} "
                f"on process {jax.process_index()}, but its output spec says {layout.describe(i)}, "
                f"so this process's block is {layout.dtypes[i].name}{list(local)}"
            )
    return leaves


def _check_in_specs(
    spec: Specialization, treedef: Any, got: Sequence[jax.ShapeDtypeStruct], name: str
) -> None:
    """The call's arguments match the ``in_specs`` the callable was specialized to.

    Raises:
        ValueError: another pytree, shape, dtype or layout, naming the argument.
    """
    assert spec.in_specs_leaves is not None
    if treedef != spec.in_specs_treedef:
        raise ValueError(
            f"colocated_python function {name!r} was specialized to in_specs "
            f"{spec.in_specs_treedef}, but is called with {treedef}"
        )
    for i, (want, have) in enumerate(zip(spec.in_specs_leaves, got, strict=True)):
        same_layout = want.sharding is None or (
            have.sharding is not None
            and want.sharding.is_equivalent_to(have.sharding, len(have.shape))
        )
        if want.shape != have.shape or want.dtype != have.dtype or not same_layout:
            raise ValueError(
                f"colocated_python function {name!r}: argument leaf {i} is {have}, but the "
                f"function was specialized to in_specs {want}"
            )


# --- the callable and its caches (NOTE [specialization caches]) ---


class _Caches:
    """Every live callable's specialization caches, as one cache jax's clear_caches() empties."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[ColocatedFunction] = weakref.WeakSet()
        register_backend_cache(self, "partitioner.colocated_python")

    def add(self, f: ColocatedFunction) -> None:
        self._live.add(f)

    def cache_clear(self) -> None:
        for f in list(self._live):
            f._clear()  # noqa: SLF001  (the owner of both caches)

    def cache_info(self) -> dict[str, int]:
        return {"functions": len(self._live)}

    def cache_keys(self) -> list[Any]:
        return []


_CACHES = _Caches()


def _weak_key(leaves: Sequence[jax.Array], treedef: Any) -> tuple[Any, ...]:
    return (treedef, tuple((x.shape, x.dtype, id(x.sharding)) for x in leaves))


def _strong_key(leaves: Sequence[jax.Array], treedef: Any) -> tuple[Any, ...]:
    return (treedef, tuple(_spec_of(x, "an argument") for x in leaves))


class ColocatedFunction:
    """A Python function that runs where its arguments' shards live (``colocated_python(fun)``)."""

    __wrapped__: Callable[..., Any]

    def __init__(
        self,
        fun: Callable[..., Any],
        spec: Specialization,
        wrapped: Callable[..., Any] | None = None,
    ) -> None:
        # As functools.wraps: the name, docstring, __wrapped__ (so inspect.signature
        # shows the function's parameters) of what it wraps; a method of a colocated
        # class runs ``fun`` (its remote object's method) but presents the method.
        functools.update_wrapper(self, wrapped or fun, updated=())
        if not hasattr(self, "__name__"):
            self.__name__ = "colocated"
        self.fun = fun
        self._spec = spec
        self._lock = threading.Lock()
        self._by_id: dict[tuple[Any, ...], _Specialized] = {}
        self._by_layout: dict[tuple[Any, ...], _Specialized] = {}
        _CACHES.add(self)

    def specialize(
        self,
        in_specs: ShapeDtypeStructTree | None = None,
        out_specs_fn: Callable[..., ShapeDtypeStructTree] | None = None,
        devices: Sequence[jax.Device] | None = None,
    ) -> ColocatedFunction:
        """A new callable, further specialized (each field at most once).

        Args:
            in_specs: the pytree of ``jax.ShapeDtypeStruct`` (with shardings) of
                ``(args, kwargs)`` every call will have.
            out_specs_fn: input specs -> output specs; then even the first call is
                asynchronous.
            devices: where to run; required for a function without arguments.

        Raises:
            ValueError: a field specialized twice ("... already specified").
        """
        return ColocatedFunction(
            self.fun,
            self._spec.update(in_specs=in_specs, out_specs_fn=out_specs_fn, devices=devices),
            self.__wrapped__,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function on the arguments' hosts; returns at once (see the module docstring).

        Raises:
            ValueError: an argument that is not a jax.Array, arguments on several
                device lists, or no arguments and no ``devices``.
        """
        _, leaves, treedef = call_leaves(_ARGUMENTS, args, kwargs)
        if not all(isinstance(leaf, jax.Array) for leaf in leaves):
            flat = flat_arguments(_ARGUMENTS, args, kwargs)
            for i, leaf in enumerate(flat.leaves):
                root = "args" if i < flat.positional else "kwargs"
                # raises, naming the argument
                _spec_of(leaf, f"argument {root}{jax.tree_util.keystr(flat.paths[i])}")
        if not leaves and self._spec.devices is None:
            raise ValueError(
                "No devices found. colocated_python function without input arguments must be "
                "first specialized with devices: f.specialize(devices=jax.devices())."
            )
        placed = _placed(leaves)
        if placed is not leaves:
            leaves = placed
            args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return self._specialized(leaves, treedef)(args, kwargs)

    def _specialized(self, leaves: list[jax.Array], treedef: Any) -> _Specialized:
        weak = _weak_key(leaves, treedef)
        found = self._by_id.get(weak)
        if found is not None:
            emit("colocated_weak_hit", name=self.__name__)
            return found
        with self._lock:
            strong = _strong_key(leaves, treedef)
            found = self._by_layout.get(strong)
            if found is not None:
                emit("colocated_strong_hit", name=self.__name__)
            else:
                spec = self._spec
                if spec.in_specs_leaves is not None:
                    _check_in_specs(spec, treedef, strong[1], self.__name__)
                else:
                    spec = spec.update(
                        in_specs=jax.tree_util.tree_unflatten(treedef, list(strong[1]))
                    )
                if spec.devices is None:
                    spec = spec.update(devices=_device_list(leaves))
                found = _Specialized(self.fun, self.__name__, spec)
                self._by_layout[strong] = found
            # Keep one id key per entry: the latest argument shardings'.
            self._by_id = {k: v for k, v in self._by_id.items() if v is not found}
            self._by_id[weak] = found
            found.in_shardings = tuple(x.sharding for x in leaves)
            return found

    def _clear(self) -> None:
        with self._lock:
            self._by_id.clear()
            self._by_layout.clear()

    def cache_size(self) -> int:
        """How many specializations are cached (the two caches hold the same ones)."""
        return len(self._by_layout)

    def __repr__(self) -> str:
        return f"<colocated_python {self.__name__}>"


def colocated_python(fun: Callable[..., Any]) -> ColocatedFunction:
    """Make ``fun`` run on the hosts that hold its ``jax.Array`` arguments' shards.

    ``g = colocated_python(fun)``; ``g(*arrays)`` returns at once with ``jax.Array``
    outputs (by default on the same devices), ready when ``fun`` has run there (in
    one process: once, on the arguments as given; over processes: once per process,
    on its host-local part, the outputs assembled into global arrays). The outputs
    keep the sharding, memory kind and dtype ``fun`` gave them (or ``out_specs_fn``
    declared). Calls made by one thread run in call order; calls made by different
    threads run concurrently; a colocated function may call another. ``g`` wraps
    ``fun`` as ``functools.wraps`` does. See ``ColocatedFunction.specialize``.

    Raises:
        TypeError: ``fun`` is not callable.
    """
    if not callable(fun):
        raise TypeError(f"colocated_python: fun must be callable, got {fun!r}")
    return ColocatedFunction(fun, Specialization())


def colocated_cpu_devices(devices_or_mesh: Any) -> Any:
    """The CPU devices beside ``devices_or_mesh`` (a mesh gives a mesh of the same shape).

    As ``jax.experimental.colocated_python.colocated_cpu_devices``: the device at
    index i of the result is the CPU device of the host of input device i; a CPU
    device is its own. Colocated functions run on CPU devices' hosts, so this is
    how a program on accelerators finds where to put a colocated call's arguments.

    Raises:
        TypeError: not a mesh or a sequence of ``jax.Device``.
        ValueError: a process without enough CPU devices for its accelerators.
    """
    if isinstance(devices_or_mesh, jax.sharding.Mesh):
        mesh = devices_or_mesh
        flat = colocated_cpu_devices(list(mesh.devices.flat))
        if all(a is b for a, b in zip(flat, mesh.devices.flat, strict=True)):
            return mesh
        return jax.sharding.Mesh(
            np.array(flat).reshape(mesh.devices.shape), mesh.axis_names, axis_types=mesh.axis_types
        )
    devices = list(devices_or_mesh) if isinstance(devices_or_mesh, Sequence) else None
    if devices is None or not all(isinstance(d, jax.Device) for d in devices):
        raise TypeError(
            "colocated_cpu_devices: expected a jax.sharding.Mesh or a sequence of jax.Device, "
            f"got {devices_or_mesh!r}"
        )
    if all(d.platform == "cpu" for d in devices):
        return devices
    spare: dict[int, list[jax.Device]] = {}
    for d in jax.devices("cpu"):
        spare.setdefault(d.process_index, []).append(d)
    out = []
    for d in devices:
        if d.platform == "cpu":
            out.append(d)
            continue
        left = spare.get(d.process_index, [])
        if not left:
            raise ValueError(
                f"colocated_cpu_devices: process {d.process_index} has no CPU device left for "
                f"{d} ({len(devices)} devices asked for); start it with more CPU devices "
                "(jax_num_cpu_devices)"
            )
        out.append(left.pop(0))
    return out
