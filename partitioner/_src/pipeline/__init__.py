"""``partitioner.pipeline``: a stack of layers run as pipeline stages over one mesh axis.

The pipeline is ordinary jax operations inside the user's program (NOTE [pipeline]
in ``program.py``). ``schedule.py`` says which microbatch and which visit every stage
works on at every step; ``shards.py`` gives each shard of a stage's batch its copy of
the stage's weights, so a step's weight gradients stay where they were made (NOTE
[pipeline gradients]); ``staged.py`` holds the layers in the order the stages need;
``microbatches.py`` chooses the microbatch count and what each step saves (NOTE
[pipeline microbatches]); ``run.py`` is the function users call, its checks in
``checks.py``.
"""
