"""The ahead-of-time stages users inspect: ``Lowered`` and ``Compiled``.

``f.lower(*args)`` stops after lowering (annotated StableHLO, nothing compiled);
``.compile()`` hands the module to XLA. ``Compiled`` reports the partitioned HLO,
XLA's cost and memory analyses, and the layouts XLA settled on: as shardings
(``input_shardings``, as ``jax.jit`` gives them) and as partition specs parsed
back by ``parse_op_sharding`` (``input_specs``).
"""

from __future__ import annotations

from typing import Any

from jax.experimental.layout import Format
from jax.tree_util import tree_flatten, tree_unflatten

from . import jax_private as jp
from . import options
from .dispatch.executable import Executable, finish, xla_layouts
from .dispatch.execute import run
from .lower.module import LoweredModule, lower_pjit_body
from .report.tables import Report
from .report.tables import build as build_report
from .spec.partition_spec import Spec
from .spec.placement import as_reported, check_compiled_layouts
from .trace.plan import CallPlan


def lower_plan(plan: CallPlan) -> Lowered:
    """Lower the body a :class:`CallPlan` describes."""
    if plan.num_consts:
        raise ValueError(
            f"{plan.api}.lower: the function closes over values of an enclosing "
            "transformation (tracers); lower it outside jax transformations."
        )
    return Lowered(lower_pjit_body(plan.params, options.use_shardy()), plan)


class Lowered:
    """A lowered pjit: annotated StableHLO, ready to compile."""

    def __init__(self, module: LoweredModule, plan: CallPlan) -> None:
        self._module = module
        self._plan = plan

    @property
    def in_tree(self) -> Any:
        return self._plan.in_tree

    @property
    def out_tree(self) -> Any:
        return self._plan.out_tree

    def as_text(self) -> str:
        """The StableHLO module with GSPMD (``mhlo.sharding``) or Shardy (``sdy.sharding``) annotations."""
        return self._module.as_text()

    def compiler_ir(self, dialect: str = "stablehlo") -> Any:
        """The lowered program before partitioning, as jax's ``Lowered.compiler_ir`` gives it.

        Args:
            dialect: ``"stablehlo"`` (the MLIR module, with our sharding
                annotations) or ``"hlo"`` (an ``XlaComputation``; ``.as_hlo_text()``
                shows the shardings as HLO ``sharding={...}`` attributes).

        Raises:
            ValueError: another dialect.
        """
        if dialect == "stablehlo":
            return self._module.module
        if dialect == "hlo":
            return jp.hlo_computation(self._module.module)
        raise ValueError(f"compiler_ir: dialect must be 'stablehlo' or 'hlo', got {dialect!r}")

    def compile(self) -> Compiled:
        """Compile with XLA's SPMD partitioner; the result is reusable."""
        return Compiled(finish(self._module, self._plan.params.jaxpr), self._plan)

    def report(self) -> Report:
        """What partitioning does to this program: compiles it, then :meth:`Compiled.report`."""
        return self.compile().report()


class Compiled:
    """A compiled pjit: call it with the dynamic arguments only."""

    def __init__(self, executable: Executable, plan: CallPlan) -> None:
        self._executable = executable
        self._plan = plan

    @property
    def executable(self) -> Executable:
        """The built executable behind this object (partitioner internals, for tools)."""
        return self._executable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, tree = tree_flatten((args, kwargs))
        if tree != self._plan.in_tree:
            raise TypeError(
                f"Compiled {self._plan.api} called with arguments of a different structure than it was "
                f"lowered for.\n  lowered for: {self._plan.in_tree}\n  called with: {tree}\n"
                "Pass only the dynamic arguments, structured as at .lower() time."
            )
        for i, (leaf, aval) in enumerate(zip(leaves, self._plan.in_avals, strict=True)):
            got = jp.shaped_abstractify(leaf)
            if got.dtype != aval.dtype or tuple(got.shape) != tuple(aval.shape):
                raise TypeError(
                    f"Compiled {self._plan.where(self._plan.num_consts + i)}: expected {aval.dtype.name}{list(aval.shape)}, "
                    f"got {got.dtype.name}{list(got.shape)}. A compiled function only accepts the "
                    "shapes and dtypes it was lowered for; lower again for new ones."
                )
        n = self._plan.num_consts
        check_compiled_layouts(
            leaves, self._executable.in_layouts[n:], lambda i: f"Compiled {self._plan.where(n + i)}"
        )
        return run(self._executable, leaves, self._plan.out_tree)[0]

    def as_text(self) -> str:
        """The partitioned HLO XLA produced (per-device shapes and collectives)."""
        return "\n\n".join(m.to_string() for m in self._executable.loaded.hlo_modules())

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

        NOTE [partitioning report] in ``report/tables.py``; ``print`` it, or read its
        ``values`` / ``collectives`` / ``memory`` / ``cost``, or ``to_json()``.
        """
        return build_report(self._plan, self._executable, self._executable.lowered.shardy)

    @property
    def input_shardings(self) -> Any:
        """The inputs' shardings, as ``jax.jit``'s ``Compiled`` gives them.

        A ``(args, kwargs)`` tree of ``jax.sharding.NamedSharding`` over the mesh:
        the layouts XLA settled on and each input's memory kind, so
        ``.spec``, ``.memory_kind`` and ``.is_equivalent_to`` work as on jax's.
        :attr:`input_specs` gives the same layouts as PartitionSpecs.
        """
        shardings = self._executable.in_shardings[self._plan.num_consts :]
        return tree_unflatten(self._plan.in_tree, [as_reported(s) for s in shardings])

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
        return tree_unflatten(self._plan.in_tree, formats[self._plan.num_consts :])

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
        specs = [s.to_partition_spec() for s in self._executable.in_specs[self._plan.num_consts :]]
        return tree_unflatten(self._plan.in_tree, specs)

    @property
    def output_specs(self) -> Any:
        """The output layouts, as PartitionSpecs parsed from the executable's OpShardings."""
        specs: list[Spec] = [s.to_partition_spec() for s in self._executable.out_specs]
        return tree_unflatten(self._plan.out_tree, specs)
