"""``python -m partitioner.inspect``: the partitioning report from a shell (see ``--help``)."""

from .._src.inspect_cli import main

raise SystemExit(main())
