"""The layout search: which layouts of a call's AUTO leaves, the cost model ranking
and XLA's figures confirming (NOTE [auto search] in ``descent.py``, NOTE [auto floor]
in ``confirm.py``). ``problem.py`` states the question, ``structure.py`` finds the
repeated layers that share a layout, ``measure.py`` compiles a finalist and reads
XLA's report, ``progress.py`` says how far along the search is.
"""
