"""``jit`` and ``pjit`` options, parsed once when a function is wrapped.

Why a record: ``jit`` and ``pjit`` are one planner with two sets of names and
one rule apart. What tells them apart (the names a user's messages quote, what
``None`` means in a spec tree) is a field here, read by free functions
(``jit_plan.py``), so neither front door switches on the other's name.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict, TypeVar, cast, get_type_hints

import jax
from jax.sharding import Mesh
from jax.tree_util import tree_leaves

from ..sharding.auto import AUTO
from ..sharding.devices import INPUT_SHARDING, OUTPUT_SHARDING
from ..sharding.tree import UNSPECIFIED, has_bare_specs, meshes_named_by, prepare_axis_resources
from ..trace.argnums import check_callable, jit_binding
from ..trace.arguments import Binding

_Door = TypeVar("_Door", bound=Callable[..., Any])


class NoneRule(enum.Enum):
    """What a ``None`` leaf of a spec tree means.

    ``UNSPECIFIED``: as ``jax.jit``: the argument as it is laid out, the output
    as XLA's propagation lays it out. ``REPLICATED_UNDER_LEGACY_MESH``: as jax
    0.10.2's ``pjit``: replicated under the classic ``with mesh:`` context (the
    2022 meaning; ``partitioner.mesh`` is one), unspecified anywhere else
    (``jax.set_mesh``, the mesh of NamedSharding leaves, no mesh at all).
    """

    UNSPECIFIED = "unspecified"
    REPLICATED_UNDER_LEGACY_MESH = "replicated under the classic mesh context"


@dataclass(frozen=True)
class Default:
    """A keyword option's default, written beside its type: ``Annotated[bool, Default(False)]``."""

    value: Any


class SharedOptions(TypedDict, total=False):
    """The keyword options ``jit`` and ``pjit`` share: one line an option, its type and default.

    NOTE [one options record]: this is the one place an option is spelled. The doors
    take them as ``**options: Unpack[...]`` (PEP 692), so a user's type checker checks
    each keyword; :func:`takes` shows them in ``inspect.signature`` and
    ``help()`` with their defaults, and :func:`options_of` refuses an unknown one in
    Python's words and fills the defaults. A new option is a line here (and a line of
    the doors' docstrings), nothing else to thread through.
    """

    in_shardings: Annotated[Any, Default(UNSPECIFIED)]
    out_shardings: Annotated[Any, Default(UNSPECIFIED)]
    static_argnames: Annotated[str | Iterable[str] | None, Default(None)]
    donate_argnames: Annotated[str | Iterable[str] | None, Default(None)]
    keep_unused: Annotated[bool, Default(False)]
    device: Annotated[Any, Default(None)]
    backend: Annotated[str | None, Default(None)]
    inline: Annotated[bool, Default(False)]
    compiler_options: Annotated[dict[str, Any] | None, Default(None)]
    auto_memory_limit: Annotated[int | None, Default(None)]


class JitOptions(SharedOptions, total=False):
    """``jit``'s keyword options: the shared ones and the argnums ``pjit`` takes by position.

    Built by :func:`options_of` with every key present, it is the record the planner
    reads (``JitInfo.options``).
    """

    static_argnums: Annotated[int | Sequence[int] | None, Default(None)]
    donate_argnums: Annotated[int | Sequence[int] | None, Default(None)]


@functools.cache
def _record_parameters(record: type) -> tuple[inspect.Parameter, ...]:
    """The record's keywords as keyword-only parameters: default, and the type as written."""
    hints = get_type_hints(record, include_extras=True)
    parameters = []
    for name, ref in record.__annotations__.items():
        written = ast.parse(ref.__forward_arg__, mode="eval").body
        assert isinstance(written, ast.Subscript) and isinstance(written.slice, ast.Tuple)
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=hints[name].__metadata__[0].value,
                annotation=ast.unparse(written.slice.elts[0]),  # "bool", as a def shows it
            )
        )
    return tuple(parameters)


def takes(record: type) -> Callable[[_Door], _Door]:
    """Set a door's ``__signature__``: its own parameters, then the record's keywords.

    What a user reads in ``inspect.signature``/``help()`` is every option by name with
    its default and type, as if spelled out in the door's ``def``.
    """

    def give(door: _Door) -> _Door:
        own = inspect.signature(door)
        kept = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        door.__signature__ = own.replace(  # type: ignore[attr-defined]
            parameters=[*kept, *_record_parameters(record)]
        )
        return door

    return give


def options_of(door: Callable[..., Any], given: Mapping[str, Any], **positional: Any) -> JitOptions:
    """The record from a door's ``**options`` and the options it took by position.

    Raises:
        TypeError: a keyword the door does not take, in Python's own words (as a
            ``def`` spelling every option would raise it).
    """
    parameters = inspect.signature(door).parameters
    for name in given:
        kind = parameters[name].kind if name in parameters else None
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"{door.__qualname__}() got some positional-only arguments passed as keyword "
                f"arguments: '{name}'"
            )
        if kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"{door.__qualname__}() got an unexpected keyword argument '{name}'")
    defaults = {p.name: p.default for p in _record_parameters(JitOptions)}
    return cast(JitOptions, {**defaults, **given, **positional})


@dataclass(frozen=True)
class Door:
    """What sets a front door's options apart from another's (a constant per door).

    Attributes:
        api: the door's name (messages, the lowered module's name).
        none_rule: what ``None`` means in its spec trees.
        use_resource_env: which mesh in context it reads (see :class:`JitInfo`).
    """

    api: str
    none_rule: NoneRule
    use_resource_env: bool


@dataclass(frozen=True)
class SpecNames:
    """The user's names for the two spec trees, for messages (``in_shardings``...)."""

    inputs: str
    outputs: str


@dataclass(frozen=True)
class JitInfo:
    """A jit-ed or pjit-ed function's options, parsed and checked.

    Attributes:
        fun / name: the user's function and its name.
        api: the front door (``"jit"``, ``"pjit"``): names it in messages and in
            the lowered module's name.
        names: the user's names of the spec arguments (messages quote them).
        none_rule: what ``None`` means in the spec trees.
        binding: how calls bind (statics, donation; ``trace/arguments.py``).
        in_specs / out_specs: the parsed trees as ``none_rule`` reads them under a mesh.
        open_in_specs / open_out_specs: the same with ``None`` unspecified; the
            same objects when the rule is UNSPECIFIED.
        named_meshes: ``(where, mesh, kind)`` of every leaf that names devices.
        needs_mesh: the name of the first spec tree with a leaf that needs a mesh
            (any spec but an omitted one), or None.
        bare_specs: the name of the first spec tree holding a PartitionSpec alone
            (which only a mesh in context gives a meaning, whatever NamedShardings
            beside it name), or None.
        use_resource_env: which mesh in context the door reads, as jax's field of
            that name: True (pjit) the classic ``with mesh:``, False (jit)
            ``jax.set_mesh``'s; the other one only gives bare PartitionSpecs a mesh
            (where jax raises).
        has_auto: some leaf is ``AUTO`` (the AUTO stage chooses it per signature).
        device: ``jit(device=...)`` (or ``backend``'s first device), else None.
        compiler_options: sorted ``(name, value)`` pairs (hashable: a cache key part).
        options: the options as given (checked); the planner reads ``keep_unused``
            (compile every input in; False prunes those the body does not use),
            ``inline`` (inside another trace, the body's equations join it, with no
            specs given) and ``auto_memory_limit`` (bytes per device AUTO layouts
            must fit, or None) there.
    """

    fun: Callable[..., Any]
    name: str
    api: str
    names: SpecNames
    none_rule: NoneRule
    binding: Binding
    in_specs: Any
    out_specs: Any
    open_in_specs: Any
    open_out_specs: Any
    named_meshes: tuple[tuple[str, Mesh, str], ...]
    needs_mesh: str | None
    bare_specs: str | None
    use_resource_env: bool
    has_auto: bool
    device: jax.Device | None
    compiler_options: tuple[tuple[str, Any], ...]
    options: JitOptions

    @property
    def label(self) -> str:
        """``"jit f"``: how messages start."""
        return self.binding.api

    def spec_trees(self, legacy_mesh: bool) -> tuple[Any, Any]:
        """The (in, out) spec trees of a call; ``legacy_mesh``: under a classic ``with mesh:``."""
        if legacy_mesh and self.none_rule is NoneRule.REPLICATED_UNDER_LEGACY_MESH:
            return self.in_specs, self.out_specs
        return self.open_in_specs, self.open_out_specs


def jit_info(
    fun: Callable[..., Any],
    door: Door,
    names: SpecNames,
    in_specs: Any,
    out_specs: Any,
    options: JitOptions,
) -> JitInfo:
    """Parse and check a ``jit``/``pjit`` call's options (every bad spec leaf at once).

    Raises:
        TypeError: ``fun`` is not callable; a bad spec leaf, argnums or option type.
        ValueError: argnums or argnames ``fun`` cannot take; both static and donated;
            ``device``/``backend`` misused (:func:`device_option`).
    """
    api = door.api
    device = device_option(options, api, in_specs, out_specs)  # placement is checked first
    check_callable(fun, api)
    name = getattr(fun, "__name__", type(fun).__name__)
    _check_options(api, options["compiler_options"], options["auto_memory_limit"])
    if isinstance(in_specs, list):
        # The top level stands for the argument tuple, so a list there is read
        # as that tuple (as jax.jit reads in_shardings); lists deeper down match lists.
        in_specs = tuple(in_specs)
    trees = _parse_trees(api, names, door.none_rule, in_specs, out_specs)
    # As jax.jit: with in-specs given, keyword arguments take their positional
    # parameter's spec (jax refuses them there: docs/api.md says why we accept).
    specs_given = in_specs is not None and in_specs is not UNSPECIFIED
    return JitInfo(
        fun=fun,
        name=name,
        api=api,
        names=names,
        none_rule=door.none_rule,
        binding=jit_binding(
            fun,
            f"{api} {name}",
            bind_keywords=specs_given,
            static_argnums=options["static_argnums"],
            static_argnames=options["static_argnames"],
            donate_argnums=options["donate_argnums"],
            donate_argnames=options["donate_argnames"],
        ),
        in_specs=trees[0],
        out_specs=trees[1],
        open_in_specs=trees[2],
        open_out_specs=trees[3],
        named_meshes=tuple(
            meshes_named_by(in_specs, f"{api} {names.inputs}", INPUT_SHARDING)
            + meshes_named_by(out_specs, f"{api} {names.outputs}", OUTPUT_SHARDING)
        ),
        needs_mesh=_needs_mesh(names, trees[2], trees[3]),
        bare_specs=_bare_specs(names, in_specs, out_specs),
        use_resource_env=door.use_resource_env,
        has_auto=any(leaf is AUTO for tree in trees[:2] for leaf in _spec_leaves(tree)),
        device=device,
        compiler_options=tuple(sorted((options["compiler_options"] or {}).items())),
        options=options,
    )


def _check_options(api: str, compiler_options: Any, auto_memory_limit: Any) -> None:
    if compiler_options is not None and not isinstance(compiler_options, dict):
        raise TypeError(
            f"{api}: compiler_options must be a dict of XLA option names to values, got "
            f"{type(compiler_options).__name__}"
        )
    if auto_memory_limit is not None and (
        isinstance(auto_memory_limit, bool)
        or not isinstance(auto_memory_limit, int)
        or auto_memory_limit <= 0
    ):
        raise TypeError(
            f"{api}: auto_memory_limit must be a positive int (bytes per device), got "
            f"{auto_memory_limit!r}"
        )


def _parse_trees(
    api: str, names: SpecNames, none_rule: NoneRule, in_specs: Any, out_specs: Any
) -> tuple[Any, Any, Any, Any]:
    """(in, out) as the rule reads them under a mesh, then (in, out) with None unspecified."""

    def parse(tree: Any, name: str, none_is_unspecified: bool) -> Any:
        return prepare_axis_resources(
            tree, name, none_is_unspecified=none_is_unspecified, allow_auto=True
        )

    open_in = parse(in_specs, f"{api} {names.inputs}", True)
    open_out = parse(out_specs, f"{api} {names.outputs}", True)
    if none_rule is NoneRule.UNSPECIFIED:
        return open_in, open_out, open_in, open_out
    return (
        parse(in_specs, f"{api} {names.inputs}", False),
        parse(out_specs, f"{api} {names.outputs}", False),
        open_in,
        open_out,
    )


def _spec_leaves(tree: Any) -> list[Any]:
    return tree_leaves(tree, is_leaf=lambda x: x is UNSPECIFIED or x is AUTO)


def _needs_mesh(names: SpecNames, open_in: Any, open_out: Any) -> str | None:
    """The name of the first parsed spec tree with a leaf that needs a mesh, or None."""
    for spec_name, tree in ((names.inputs, open_in), (names.outputs, open_out)):
        if _has_given_specs(tree):
            return spec_name
    return None


def _bare_specs(names: SpecNames, in_specs: Any, out_specs: Any) -> str | None:
    """The name of the first spec tree (as given) with a PartitionSpec leaf, or None."""
    for spec_name, tree in ((names.inputs, in_specs), (names.outputs, out_specs)):
        if has_bare_specs(tree):
            return spec_name
    return None


def _has_given_specs(parsed_tree: Any) -> bool:
    """Whether a parsed spec tree has a leaf that needs a mesh (not UNSPECIFIED)."""
    return any(leaf is not UNSPECIFIED for leaf in _spec_leaves(parsed_tree))


def device_option(options: JitOptions, api: str, in_specs: Any, out_specs: Any) -> Any:
    """Check jax.jit's placement options; the device a mesh-less call defaults to (or None).

    ``keep_unused`` and ``inline`` are checked as jax.jit's flags (``inline`` is a
    property of the caller's jaxpr; ``keep_unused`` goes into the options record).
    ``device``/``backend`` are deprecated in jax.jit, which warns; they exclude
    given shardings (a device *is* the sharding of every input and output).

    Raises:
        TypeError: ``device`` is not a jax.Device, or a flag is not a bool.
        ValueError: both ``device`` and ``backend``, either with given shardings,
            or an unknown backend.
    """
    device, backend = options["device"], options["backend"]
    for name, flag in (("keep_unused", options["keep_unused"]), ("inline", options["inline"])):
        if not isinstance(flag, bool):
            raise TypeError(f"{api}: {name} must be a bool, got {flag!r}")
    if device is None and backend is None:
        return None
    warnings.warn(
        "backend and device argument on jit is deprecated. You can use "
        '`jax.device_put(..., jax.local_devices(backend="cpu")[0])` on the inputs to the '
        "jitted function to get the same behavior.",
        DeprecationWarning,
        stacklevel=4,  # the user's call of the door (door -> jit_info -> here)
    )
    if device is not None and backend is not None:
        raise ValueError(
            f"can't specify both a device and a backend for jit, got {device=} and {backend=}"
        )
    for what, specs in (("in_shardings", in_specs), ("out_shardings", out_specs)):
        if specs is not None and specs is not UNSPECIFIED:
            raise ValueError(
                f"If backend or device is specified on jit, then {what} should not be specified."
            )
    if device is not None and not isinstance(device, jax.Device):
        raise TypeError(f"{api}: device must be a jax.Device, got {device!r}")
    if backend is not None:
        try:
            return jax.devices(backend)[0]
        except RuntimeError as e:
            raise ValueError(f"{api}: backend {backend!r} is not available: {e}") from None
    return device
