"""What every port of jax's own tests here shares: the ``door`` fixture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.jit_conformance import DOORS


@pytest.fixture(params=sorted(DOORS))
def door(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``partitioner.jit`` and ``partitioner.pjit`` (today's keyword spelling), in turn."""
    return DOORS[request.param]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under this folder ``conformance`` (``-m "not conformance"`` skips the
    ports of jax's suites). pytest hands this hook the whole session's items, so it
    picks this folder's by path."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.conformance)
