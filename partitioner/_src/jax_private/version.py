"""The jax releases the gateway is written against, and the check that refuses others."""

from __future__ import annotations

import re as _re

#: ``(lowest, first unsupported)`` jax release, as ``(major, minor)``; pyproject pins the same.
SUPPORTED_JAX = ((0, 10), (0, 11))


def check_jax_version(version: str) -> None:
    """Raise ImportError unless ``version`` is a jax release the gateway supports.

    Every name the gateway reads is private to jax and may change in any release,
    so an unsupported jax fails here, at import, with what to install, rather than
    later with an AttributeError deep inside a trace or a lowering.
    """
    found = _re.match(r"(\d+)\.(\d+)", version)
    low, high = SUPPORTED_JAX
    if found is None or not low <= (int(found[1]), int(found[2])) < high:
        raise ImportError(
            f"partitioner supports jax {low[0]}.{low[1]}.x (it builds on jax's private "
            f"API, which changes between releases); found jax {version}. Install "
            f'"jax>={low[0]}.{low[1]},<{high[0]}.{high[1]}" and the matching jaxlib.'
        )
