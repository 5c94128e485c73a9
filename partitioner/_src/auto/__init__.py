"""AUTO specs: partitioner chooses layouts (NOTE [auto search] in ``search.py``)."""
