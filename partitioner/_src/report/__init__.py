"""Reports: what partitioning did to a compiled program (NOTE [partitioning report]).

``tables`` builds the report from a call plan and its executable; ``collectives``
reads the collectives XLA inserted from the partitioned HLO. Below the AOT stages,
which hand it their plan and executable (``Lowered.report``, ``Compiled.report``).
"""
