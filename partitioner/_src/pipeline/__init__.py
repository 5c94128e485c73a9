"""``partitioner.pipeline``: a stack of layers run as pipeline stages over one mesh axis.

NOTE [pipeline]: the pipeline is one SPMD program, partitioned by XLA like any
other: no manual region, no second controller. The stacked parameters are
reshaped to ``[repeats, stages, per_visit, ...]`` and laid out with the stage
dimension over the axis, so each device holds its stage's layers. The
activations in flight are one array ``[stages, microbatch, ...]`` laid out the
same way; each step every stage applies its layers to its slot (a ``vmap`` over
the stage dimension with ``spmd_axis_name=axis``, so the constraints a layer
makes keep the stage dimension split), then the array is rolled by one along the
stage dimension, which XLA's partitioner turns into a collective-permute between
neighbours. Stage 0 takes a fresh microbatch where its schedule says so; the last
stage's results are kept in its own slot of the output buffer (no traffic per
step) and leave it once at the end. Bubble slots compute on values that are
never read (real activations: the stages start on the first microbatch, so a
layer undefined at zero puts no NaN into the gradients), so values and gradients
are the plain scan's (``jax.grad``,
``jax.vmap`` and ``jax.checkpoint`` go through ordinary jax operations).
``schedule.py`` says which microbatch and which repeat every stage works on at
every step; ``microbatches.py`` chooses their number when it is not given.
"""
