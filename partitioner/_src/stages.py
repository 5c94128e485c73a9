"""The ahead-of-time stages users inspect: ``Lowered`` and ``Compiled``.

``f.lower(*args)`` stops after lowering (annotated StableHLO, nothing compiled);
``.compile()`` hands the module to XLA. ``Compiled`` reports the partitioned HLO,
XLA's cost and memory analyses, and the layouts XLA settled on, parsed back into
partition specs by ``parse_op_sharding``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jax.tree_util import tree_flatten, tree_unflatten

from . import jax_private as jp
from . import options
from .compile import compile_lowered
from .dispatch.execute import Runnable, execute, make_runnable
from .lower.module import LoweredModule, lower_pjit_body
from .spec.partition_spec import Spec

if TYPE_CHECKING:
    from .pjit import CallPlan


def lower_plan(plan: CallPlan, name: str) -> Lowered:
    """Lower the body a :class:`~partitioner.api.CallPlan` describes."""
    if plan.num_consts:
        raise ValueError(
            f"pjit {name}.lower: the function closes over values of an enclosing transformation "
            "(tracers); lower it outside jax transformations."
        )
    p = plan.params
    module = lower_pjit_body(
        p["jaxpr"],
        p["in_axis_resources"],
        p["out_axis_resources"],
        p["mesh"],
        p["donated_invars"],
        name,
        options.use_shardy(),
    )
    return Lowered(module, plan)


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
        """The MLIR module itself (only the ``stablehlo`` dialect is available)."""
        if dialect != "stablehlo":
            raise ValueError(f"compiler_ir: only dialect='stablehlo' is available, got {dialect!r}")
        return self._module.module

    def compile(self) -> Compiled:
        """Compile with XLA's SPMD partitioner; the result is reusable."""
        return Compiled(
            make_runnable(compile_lowered(self._module, self._plan.params["jaxpr"])), self._plan
        )


class Compiled:
    """A compiled pjit: call it with the dynamic arguments only."""

    def __init__(self, runnable: Runnable, plan: CallPlan) -> None:
        self._runnable = runnable
        self._plan = plan

    @property
    def executable(self) -> Runnable:
        """The built executable behind this object (partitioner internals, for tools)."""
        return self._runnable

    @property
    def _executable(self) -> Any:
        return self._runnable.compiled.executable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, tree = tree_flatten((args, kwargs))
        if tree != self._plan.in_tree:
            raise TypeError(
                "Compiled pjit called with arguments of a different structure than it was "
                f"lowered for.\n  lowered for: {self._plan.in_tree}\n  called with: {tree}\n"
                "Pass only the dynamic arguments, structured as at .lower() time."
            )
        for i, (leaf, aval) in enumerate(zip(leaves, self._plan.in_avals, strict=True)):
            got = jp.shaped_abstractify(leaf)
            if got.dtype != aval.dtype or tuple(got.shape) != tuple(aval.shape):
                raise TypeError(
                    f"Compiled pjit argument {i} (flat): expected {aval.dtype.name}{list(aval.shape)}, "
                    f"got {got.dtype.name}{list(got.shape)}. A compiled function only accepts the "
                    "shapes and dtypes it was lowered for; lower again for new ones."
                )
        outs = execute(self._runnable, leaves)
        return tree_unflatten(self._plan.out_tree, outs)

    def as_text(self) -> str:
        """The partitioned HLO XLA produced (per-device shapes and collectives)."""
        return "\n\n".join(m.to_string() for m in self._executable.hlo_modules())

    def cost_analysis(self) -> Any:
        return self._executable.cost_analysis()

    def memory_analysis(self) -> Any:
        """XLA's per-device memory statistics (argument, output, temp, alias sizes in bytes)."""
        return self._executable.get_compiled_memory_stats()

    @property
    def input_shardings(self) -> Any:
        """The input layouts, as PartitionSpecs parsed from the executable's OpShardings."""
        specs = [
            s.to_partition_spec() for s in self._runnable.compiled.in_specs[self._plan.num_consts :]
        ]
        return tree_unflatten(self._plan.in_tree, specs)

    @property
    def output_shardings(self) -> Any:
        """The output layouts, as PartitionSpecs parsed from the executable's OpShardings."""
        specs: list[Spec] = [s.to_partition_spec() for s in self._runnable.compiled.out_specs]
        return tree_unflatten(self._plan.out_tree, specs)
