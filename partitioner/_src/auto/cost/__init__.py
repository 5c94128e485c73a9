"""The cost model: what a layout of every value costs a program, without compiling it.

NOTE [auto cost model] in ``values.py`` says what is counted (bytes each collective
moves on one device, peak bytes held, flops per device) and how a walk of the
jaxpr counts it: ``walk.py`` applies one rule per equation (``rules.py`` registers
them by primitive), ``layouts.py`` prices a move between two layouts, ``flops.py``
is the one flop counter AUTO and the pipeline share.
"""
