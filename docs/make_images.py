"""Draw the layout pictures the tutorial shows (``nox -s docs`` runs this first).

python docs/make_images.py
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from partitioner import PartitionSpec as P  # noqa: E402
from partitioner import inspect  # noqa: E402

IMAGES = Path(__file__).resolve().parent / "images"


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    inspect.visualize(
        spec=P("data"), shape=(8, 16), mesh=mesh, png=str(IMAGES / "batch_layout.png"), show=False
    )
    inspect.visualize(
        spec=P(None, "model"),
        shape=(16, 4),
        mesh=mesh,
        png=str(IMAGES / "weight_layout.png"),
        show=False,
    )


if __name__ == "__main__":
    main()
