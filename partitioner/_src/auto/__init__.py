"""AUTO specs: partitioner chooses layouts, and what to recompute to fit a memory limit.

Three rooms, each importing only the ones before it: ``cost/`` (what a layout costs a
program: the cost model), ``search/`` (which layouts, the model ranking and XLA
confirming: NOTE [auto search] in ``search/descent.py``, NOTE [auto floor] in
``search/confirm.py``) and ``remat/`` (what to recompute: NOTE [auto remat] in
``remat/__init__.py``). ``resolve.py`` is the one place that ties them together for one program;
``whole_plan.py`` weighs whole plans, a body traced once per pipeline decision (NOTE
[whole plan]); ``searched.py`` keeps what the searches found, the pipeline's microbatch
searches' too.
"""
