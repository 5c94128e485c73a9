"""Rematerialization: what a training step recomputes in its backward pass to fit a limit.

NOTE [auto remat]: when no layout fits ``auto_memory_limit``, AUTO also chooses what
to recompute. What memory holds in a training step is the residuals: the values
``jax.grad`` inside the call saved in the forward pass for the backward pass to
read. Rematerializing trades that memory for flops, as ``jax.checkpoint`` does: a
*recompute policy* gives each recomputable part of the program one of jax's own checkpoint
policies, or none (``policies.py``). The parts are found in the traced program
(``fit.py``):

- a differentiated ``scan`` (``scans.py``): a forward scan that stacks, per step,
  the residuals, and a backward scan (the other direction, the same length) that
  reads them as its ``xs``. A scan differentiated inside a ``jax.jit`` (or a nested
  ``partitioner.jit``) call, a loss written as a jitted function as many training
  loops are, has its forward scan in one call and its backward scan in another:
  such calls, when they give their operands and results no layout, are inlined
  first (``inline.py``), so their scans are found as top-level ones are;
- failing that, the equal layers of an unrolled stack (NOTE [auto remat unrolled]
  in ``unrolled.py``).

Applying a policy rewrites the traced program as ``jax.checkpoint(policy=...)`` on
the part would have: walking back from its residuals, an equation the policy calls
saveable (``policy(prim, *avals, **params)``, read as jax reads it) keeps its
outputs; any other one is recomputed in the backward pass from the kept values. The
recomputation runs the same operations on the same values, so results are
unchanged; only memory and flops move. XLA's memory analysis of each recompute
policy's compiled program is the judge, XLA's cost analysis the price (``fit.py``). A
policy first keeps the layouts the search chose without the limit, as a user adds
``jax.checkpoint`` to a program that is too large (one compile); only where they do not
fit with it are the layouts searched again under the limit (searching first would
cost a search per policy). That search prices layouts as policies are priced, by XLA's
flops first (NOTE [auto floor], ``Objective.FLOPS``): by estimated step time, a
layout that moves fewer bytes but splits the compute less would win and recompute
more flops per device (``benchmarks/remat_case.py`` measures both orders).

Every rewrite evaluates the program with a few equations replaced through one
interpreter (``interpret.py``).
"""
