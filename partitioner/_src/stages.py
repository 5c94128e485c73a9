"""The ahead-of-time stages users inspect: ``Traced``, ``Lowered`` and ``Compiled``.

``f.trace(*args)`` stops after tracing (the jaxpr), ``f.lower(*args)`` after
lowering (annotated StableHLO, nothing compiled), and ``.compile()`` hands the
module to XLA (or takes it from jax's persistent cache, NOTE [persistent
compilation cache] in ``compiler/compile.py``).

NOTE [stages API]: the names and the shapes of the answers are jax.jit's
(``jax.stages``), so code scripted against jax.jit's stages runs on ours:
``args_info`` (a tree of ``jax.stages.ArgInfo``), ``in_tree`` / ``out_tree``,
``in_avals``, ``out_info``, ``donate_argnums``, ``as_text(dialect=...)``,
``compiler_ir(dialect)``, ``cost_analysis()``, ``compile(compiler_options=...)``,
``runtime_executable()`` and ``input_formats`` / ``output_formats``. ``Compiled.input_shardings``
/ ``output_shardings`` are jax shardings as jax.jit gives them (memory kinds
included), with the same layouts as PartitionSpecs under ``input_specs`` /
``output_specs`` (parsed back by ``parse_op_sharding``). One deliberate
difference (docs/api.md): the lowered module names every argument
(``jax.arg_info``) where jax keeps the names only in debug locations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
from jax.experimental.layout import Format
from jax.stages import ArgInfo
from jax.tree_util import PyTreeDef, keystr, tree_unflatten

from . import jax_private as jp
from . import lazy, options
from .compiler.cache import get_lowered_executable
from .compiler.compile import CompilerOptions
from .compiler.executable import Executable, named_sharding, xla_layouts
from .dispatch.execute import run
from .lower.module import LoweredModule, lower_pjit_body, warn_unusable_donations
from .lower.prune import prune_unused_inputs
from .primitives.call_plan import CallPlan
from .sharding.leaves import as_reported, check_compiled_layouts
from .sharding.partition_spec import Spec
from .trace.arguments import Binding, call_leaves

# The report tables load with the first report, not with ``import partitioner``.
if TYPE_CHECKING:
    from .inspect import tables
    from .inspect.tables import Report
else:
    tables = lazy.module("partitioner._src.inspect.tables")

_DIALECTS = ("stablehlo", "hlo")

#: A compiled function takes the dynamic arguments only: nothing of its call is static.
_DYNAMIC_ONLY = Binding("Compiled")


def lower_plan(plan: CallPlan) -> Lowered:
    """Lower the body a :class:`CallPlan` describes."""
    return Traced(plan).lower()


def _check_dialect(dialect: str | None, api: str) -> str:
    dialect = "stablehlo" if dialect is None else dialect
    if dialect not in _DIALECTS:
        raise ValueError(
            f"{api}: unknown dialect {dialect!r}; the dialect must be 'stablehlo' or 'hlo' "
            "(as for jax.jit's stages)."
        )
    return dialect


class _Stage:
    """What every stage says about its arguments, as ``jax.stages.Stage`` does."""

    _plan: CallPlan

    @property
    def args_info(self) -> Any:
        """A tree (of the dynamic arguments) of ``jax.stages.ArgInfo``: aval and donation."""
        donated = self._plan.params.donated_invars[self._plan.num_consts :]
        return tree_unflatten(
            self._plan.in_tree,
            [ArgInfo(a, d) for a, d in zip(self._plan.in_avals, donated, strict=True)],
        )

    @property
    def in_tree(self) -> PyTreeDef:
        """Tree structure of the pair (dynamic positional arguments, keyword arguments)."""
        return self._plan.in_tree

    @property
    def out_tree(self) -> PyTreeDef:
        return self._plan.out_tree

    @property
    def in_avals(self) -> Any:
        """The tree of input avals."""
        return tree_unflatten(self._plan.in_tree, list(self._plan.in_avals))

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """Flat indices of the donated arguments."""
        donated = self._plan.params.donated_invars[self._plan.num_consts :]
        return tuple(i for i, d in enumerate(donated) if d)

    @property
    def fun_name(self) -> str:
        return self._plan.params.name


class Traced(_Stage):
    """A traced pjit (``f.trace(*args)``): the jaxpr of its body, ready to lower."""

    def __init__(self, plan: CallPlan) -> None:
        self._plan = plan

    @property
    def jaxpr(self) -> Any:
        """The body's ClosedJaxpr: one input per flat dynamic argument."""
        return self._plan.params.jaxpr

    @property
    def out_avals(self) -> Any:
        return tree_unflatten(self._plan.out_tree, list(self.jaxpr.out_avals))

    @property
    def out_info(self) -> Any:
        """The outputs as ``jax.ShapeDtypeStruct``s, with their NamedSharding where a spec fixes it."""
        specs = self._plan.params.out_axis_resources
        return _shape_dtype_structs(self._plan, self.jaxpr.out_avals, specs)

    def lower(self) -> Lowered:
        """Lower to annotated StableHLO for the partitioner in effect (Shardy or GSPMD)."""
        plan = self._plan
        if plan.num_consts:
            raise ValueError(
                f"{plan.api}.lower: the function closes over values of an enclosing "
                "transformation (tracers); lower it outside jax transformations."
            )
        program, kept = prune_unused_inputs(plan.params)
        settings = jp.lowering_settings()
        module = lower_pjit_body(program, options.use_shardy())
        warn_unusable_donations(module)  # jax.jit warns when it lowers
        return Lowered(module, plan, program.jaxpr, kept, settings)


def _shape_dtype_structs(plan: CallPlan, avals: Sequence[Any], specs: Sequence[Any]) -> Any:
    structs = [
        jax.ShapeDtypeStruct(
            a.shape,
            a.dtype,
            sharding=None if s is None else named_sharding(plan.mesh, s),
            weak_type=a.weak_type,
        )
        for a, s in zip(avals, specs, strict=True)
    ]
    return tree_unflatten(plan.out_tree, structs)


class Lowered(_Stage):
    """A lowered pjit: annotated StableHLO, ready to compile."""

    def __init__(
        self,
        module: LoweredModule,
        plan: CallPlan,
        program: Any,
        kept: tuple[int, ...] | None,
        settings: tuple[Any, ...],
    ) -> None:
        """``program``: the body lowered (unused inputs pruned: ``kept`` are the call's
        inputs it takes, None for all); ``settings``: the jax settings it was lowered
        under (``jp.lowering_settings()``), part of its executable's key."""
        self._module = module
        self._plan = plan
        self._program = program
        self._kept = kept
        self._settings = settings
        self._executable: Executable | None = None  # compiled with default options, kept

    @property
    def out_info(self) -> Any:
        """The outputs as ``jax.ShapeDtypeStruct``s, with their NamedSharding where a spec fixes it."""
        return _shape_dtype_structs(self._plan, self._module.out_avals, self._module.out_specs)

    def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> str:
        """The module as text, annotated for GSPMD (``mhlo.sharding``) or Shardy (``sdy.sharding``).

        Args:
            dialect: ``"stablehlo"`` (the default) or ``"hlo"`` (HLO text, the
                shardings as ``sharding={...}``).
            debug_info: include source locations (and, in HLO, op metadata).

        Raises:
            ValueError: another dialect.
        """
        if _check_dialect(dialect, "Lowered.as_text") == "hlo":
            return jp.hlo_text(self._module.module, debug_info)
        return self._module.as_text(debug_info)

    def compiler_ir(self, dialect: str | None = None) -> Any:
        """The lowered program before partitioning, as jax's ``Lowered.compiler_ir`` gives it.

        Args:
            dialect: ``"stablehlo"`` (the default: the MLIR module, with our
                sharding annotations) or ``"hlo"`` (an ``XlaComputation``;
                ``.as_hlo_text()`` shows the shardings as ``sharding={...}``).

        Raises:
            ValueError: another dialect.
        """
        if _check_dialect(dialect, "Lowered.compiler_ir") == "hlo":
            return jp.hlo_computation(self._module.module)
        return self._module.module

    def cost_analysis(self) -> Any:
        """XLA's cost estimates of the *unpartitioned, unoptimized* program (a dict), or None.

        As jax's: the figures come before any optimization; ``compile().cost_analysis()``
        gives the partitioned program's. None where the backend has no such
        analysis (plugins behind the PJRT C API).
        """
        backend = jp.get_device_backend(self._module.mesh.devices.flat[0])
        if jp.using_pjrt_c_api(backend):
            return None
        hlo_module = jp.hlo_computation(self._module.module).as_hlo_module()
        return jp.hlo_module_cost_analysis(backend, hlo_module)

    def compile(
        self,
        compiler_options: CompilerOptions | None = None,
        *,
        device_assignment: Sequence[jax.Device] | None = None,
    ) -> Compiled:
        """Compile with XLA's SPMD partitioner (or load from the persistent cache).

        Without ``compiler_options`` the executable is kept: compiling again
        returns it (as jax.jit's ``Lowered.compile`` does). It is the executable
        calls of the same program run (same devices, options and jax settings):
        whichever of the two comes first compiles it, once.

        Args:
            compiler_options: XLA options by name, as jax.jit's ``Lowered.compile``
                takes them (``{"xla_embed_ir_in_executable": True}``, or build
                options such as ``"exec_time_optimization_effort"``). An unknown
                name or bad value raises jax's ``JaxRuntimeError``
                (``INVALID_ARGUMENT: No such compile option``), as under jax.jit.
            device_assignment: must be the mesh's devices, in order, if given.

        Raises:
            TypeError: ``compiler_options`` is not a dict, or a value is not hashable.
            ValueError: ``device_assignment`` differs from the mesh's devices.
        """
        if compiler_options is not None and not isinstance(compiler_options, dict):
            raise TypeError(
                f"{self._plan.api}.lower(...).compile: compiler_options must be a dict of "
                f"XLA option names to values, got {type(compiler_options).__name__}"
            )
        mesh_devices = list(self._module.mesh.devices.flat)
        if device_assignment is not None and list(device_assignment) != mesh_devices:
            raise ValueError(
                f"{self._plan.api}.lower(...).compile: device_assignment must match the "
                f"mesh's devices {[d.id for d in mesh_devices]}, got "
                f"{[getattr(d, 'id', d) for d in device_assignment]}. Lower under a mesh of "
                "those devices instead."
            )
        # As jax's: compiled once with default options, then reused by later calls;
        # a jit(..., compiler_options=...) function's options are its defaults. The
        # executable is the one calls of the same program get (NOTE [executable
        # cache]), whichever of the two compiled it first.
        default = compiler_options is None
        if default:
            if self._executable is not None:
                return Compiled(self._executable, self._plan)
            compiler_options = dict(self._plan.params.compiler_options)
        executable, _ = get_lowered_executable(
            self._plan.params,
            self._module,
            self._program,
            self._kept,
            self._settings,
            compiler_options,
        )
        if default:
            self._executable = executable
        return Compiled(executable, self._plan)

    def report(self) -> Report:
        """What partitioning does to this program: compiles it, then :meth:`Compiled.report`."""
        return self.compile().report()


def _tree_mismatch(tree: PyTreeDef, plan: CallPlan) -> str:
    """jax's message for a compiled function called with another pytree, then ours."""
    errors = jp.pytree_differences(tree, plan.in_tree)
    lines = [
        "Function compiled with input pytree does not match the input pytree it was called "
        f"with. There are {len(errors)} mismatches, including:"
    ]
    for path, new, old, explanation in errors:
        first, *rest = path
        base = ("args", "kwargs")[first.idx]
        lines.append(
            f"    * at {base}{keystr(tuple(rest))}, seen {old} but now given {new}, so {explanation}"
        )
    lines.append(
        f"(Compiled {plan.api} takes only the dynamic arguments, structured as at .lower() time.)"
    )
    return "\n".join(lines)


def _check_arg_types(leaves: Sequence[Any], plan: CallPlan) -> None:
    """Every argument's shape and dtype is the one it was lowered for (jax's message).

    Raises:
        TypeError: naming each mismatch (the first five), as jax names them.
    """
    names = _arg_names(plan)
    errors = [
        f"Argument '{names[i]}' compiled with {aval.str_short()} and called with {got.str_short()}"
        for i, (leaf, aval) in enumerate(zip(leaves, plan.in_avals, strict=True))
        if ((got := jp.shaped_abstractify(leaf)).shape, got.dtype) != (aval.shape, aval.dtype)
    ]
    if errors:
        first = f"The first 5 of {len(errors)}" if len(errors) >= 5 else "The"
        raise TypeError(
            "Argument types differ from the types for which this computation was compiled. "
            "Perhaps you are calling the compiled executable with a different enable_x64 mode "
            f"than when it was AOT compiled? {first} mismatches are:\n"
            + "\n".join(errors[:5])
            + f"\n(Compiled {plan.api} accepts only what it was lowered for: lower again.)"
        )


def _arg_names(plan: CallPlan) -> list[str]:
    """Each dynamic argument's name as jax's messages give it (``x``, ``params['w']``)."""
    n = len(plan.in_avals)
    debug = plan.params.jaxpr.jaxpr.debug_info
    names = list(debug.arg_names or ()) if debug is not None else []
    names = names[-n:] if len(names) >= n else []
    return [name or f"args[{i}]" for i, name in enumerate(names)] or [
        f"args[{i}]" for i in range(n)
    ]


class Compiled(_Stage):
    """A compiled pjit: call it with the dynamic arguments only."""

    def __init__(self, executable: Executable, plan: CallPlan) -> None:
        self._executable = executable
        self._plan = plan

    @property
    def executable(self) -> Executable:
        """The built executable behind this object (partitioner internals, for tools)."""
        return self._executable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on the dynamic arguments, which must have the tree, shapes and dtypes
        it was lowered for.

        Raises:
            TypeError: as jax's compiled functions: another tree, another shape or
                dtype, or a tracer (a compiled function cannot be transformed).
        """
        _, leaves, tree = call_leaves(_DYNAMIC_ONLY, args, kwargs)
        if tree != self._plan.in_tree:
            raise TypeError(_tree_mismatch(tree, self._plan))
        if not jp.at_top_level():
            for leaf in leaves:
                if isinstance(leaf, jp.Tracer):
                    raise TypeError(
                        "Cannot apply JAX transformations to a function lowered and compiled "
                        f"for a particular signature. Detected argument of Tracer type "
                        f"{type(leaf)}. ({self._plan.api}: lower the transformed function "
                        "instead, e.g. jit(vmap(f)).lower(...))"
                    )
        _check_arg_types(leaves, self._plan)
        n = self._plan.num_consts
        # Stated layouts, one per input the program takes (none stated: XLA's default).
        stated = self._executable.in_layouts
        layouts = self._per_input(list(stated)) if stated else []
        check_compiled_layouts(leaves, layouts, lambda i: f"Compiled {self._plan.where(n + i)}")
        where = lambda i: f"Compiled {self._plan.where(self._plan.num_consts + i)}"  # noqa: E731
        strict = not options.reshard_committed_enabled()
        return run(self._executable, leaves, self._plan.out_tree, where, strict=strict)[0]

    @property
    def out_info(self) -> Any:
        """The outputs as ``jax.ShapeDtypeStruct``s with the NamedShardings XLA settled on."""
        return _shape_dtype_structs(
            self._plan, self._executable.lowered.out_avals, self._executable.out_specs
        )

    def as_text(self) -> str:
        """The partitioned HLO XLA produced (per-device shapes and collectives)."""
        return "\n\n".join(m.to_string() for m in self._executable.loaded.hlo_modules())

    def runtime_executable(self) -> Any:
        """jaxlib's ``LoadedExecutable`` behind this program, as jax.jit's ``Compiled`` gives it."""
        return self._executable.loaded

    def cost_analysis(self) -> Any:
        """XLA's cost estimates for one device's program, as XLA's HLO cost analysis gives them.

        A dict keyed by XLA's names: ``"flops"``, ``"transcendentals"``,
        ``"bytes accessed"`` and per-operand ``"bytes accessedN{}"``, ... (estimates
        from the partitioned HLO, per device, not measurements). ``report()`` shows
        the main ones.
        """
        return self._executable.loaded.cost_analysis()

    def memory_analysis(self) -> Any:
        """XLA's per-device memory statistics of the compiled program, in bytes.

        jaxlib's ``CompiledMemoryStats``: ``argument_size_in_bytes``,
        ``output_size_in_bytes``, ``temp_size_in_bytes`` (XLA's scratch),
        ``alias_size_in_bytes`` (outputs that reuse donated inputs) and
        ``generated_code_size_in_bytes``. One device's figures: the program is SPMD.
        """
        return self._executable.loaded.get_compiled_memory_stats()

    def report(self) -> Report:
        """Values (asked and chosen layouts), collectives, memory and cost, as tables.

        NOTE [partitioning report] in ``inspect/tables.py``; ``print`` it, or read its
        ``values`` / ``collectives`` / ``memory`` / ``cost``, or ``to_json()``.
        """
        return tables.build(self._plan, self._executable, self._executable.lowered.shardy)

    def _per_input(self, values: list[Any]) -> list[Any]:
        """One value per input the program takes -> one per dynamic argument (None where
        the argument was pruned, as jax.jit's stages report it)."""
        n = self._plan.num_consts + len(self._plan.in_avals)
        return self._executable.per_input(values, n)[self._plan.num_consts :]

    @property
    def input_shardings(self) -> Any:
        """The inputs' shardings, as ``jax.jit``'s ``Compiled`` gives them (None for an
        argument the program does not take, ``keep_unused=False``).

        A ``(args, kwargs)`` tree of ``jax.sharding.NamedSharding`` over the mesh:
        the layouts XLA settled on and each input's memory kind, so
        ``.spec``, ``.memory_kind`` and ``.is_equivalent_to`` work as on jax's.
        :attr:`input_specs` gives the same layouts as PartitionSpecs.
        """
        shardings = [as_reported(s) for s in self._executable.in_shardings]
        return tree_unflatten(self._plan.in_tree, self._per_input(shardings))

    @property
    def output_shardings(self) -> Any:
        """The outputs' shardings (NamedShardings, with memory kinds), as ``jax.jit``'s."""
        shardings = [as_reported(s) for s in self._executable.out_shardings]
        return tree_unflatten(self._plan.out_tree, shardings)

    @property
    def input_formats(self) -> Any:
        """The inputs' ``Format``s (XLA's memory layout and the sharding), as ``jax.jit``'s.

        Where a spec asked for ``Layout.AUTO`` this is the layout XLA chose: lay
        arguments out with ``jax.device_put(x, fmt)`` to call without a relayout.
        """
        ins, _ = xla_layouts(self._executable.lowered, self._executable.loaded)
        shardings = self._executable.in_shardings
        formats = [Format(layout, as_reported(s)) for layout, s in zip(ins, shardings, strict=True)]
        return tree_unflatten(self._plan.in_tree, self._per_input(formats))

    @property
    def output_formats(self) -> Any:
        """The outputs' ``Format``s (XLA's memory layout and the sharding), as ``jax.jit``'s."""
        _, outs = xla_layouts(self._executable.lowered, self._executable.loaded)
        shardings = self._executable.out_shardings
        formats = [
            Format(layout, as_reported(s)) for layout, s in zip(outs, shardings, strict=True)
        ]
        return tree_unflatten(self._plan.out_tree, formats)

    @property
    def input_specs(self) -> Any:
        """The input layouts, as PartitionSpecs parsed from the executable's OpShardings."""
        specs = [s.to_partition_spec() for s in self._executable.in_specs]
        return tree_unflatten(self._plan.in_tree, self._per_input(specs))

    @property
    def output_specs(self) -> Any:
        """The output layouts, as PartitionSpecs parsed from the executable's OpShardings."""
        specs: list[Spec] = [s.to_partition_spec() for s in self._executable.out_specs]
        return tree_unflatten(self._plan.out_tree, specs)
