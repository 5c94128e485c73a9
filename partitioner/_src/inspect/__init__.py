"""What partitioning did: the private side of ``partitioner.inspect``, in one package.

Its modules sit at two heights of the pipeline (tests/test_architecture.py places
each by name), which is why this ``__init__`` imports nothing:

- below the AOT stages, which hand them a plan and its executable
  (``Lowered.report``, ``Compiled.report``): ``tables`` builds the report
  (NOTE [partitioning report]), ``collectives`` reads the collectives XLA
  inserted from the partitioned HLO, ``visualize`` draws layouts;
- above the stages: ``api`` (``report(f, *args)`` with the residuals of
  ``jax.vjp(f)``, ``compare_partitioners``).

The shell, ``python -m partitioner.inspect``, pjits the function it is given, so
it lives above the front doors, in the public package's ``__main__.py``.
"""
