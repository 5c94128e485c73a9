"""What every port of jax's own tests here shares: the ``door`` fixture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conformance.jit_conformance import DOORS


@pytest.fixture(params=sorted(DOORS))
def door(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``partitioner.jit`` and ``partitioner.pjit`` (today's keyword spelling), in turn."""
    return DOORS[request.param]
