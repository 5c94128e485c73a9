"""The strategies find every planted bug of the catalogue (``bug_catalogue.py``), and
flag no correct twin, at hypothesis' default settings with no saved examples.

CI runs each property from five seeds on the planted bug and one on its twin; the
how-to's table comes from ``python -m tests.testing.bug_catalogue --seeds 20``.
"""

from __future__ import annotations

import pytest

from tests.testing.bug_catalogue import CATALOGUE, Case, finds

pytestmark = pytest.mark.slow  # 66 runs of 100 examples


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda c: c.helper.replace(" ", "-"))
def test_every_planted_bug_is_found_and_no_correct_twin_flagged(case: Case) -> None:
    for run_seed in (101, 202, 303, 404, 505):
        assert finds(case, case.buggy, run_seed), f"{case.helper}: {case.bug} not found"
    assert not finds(case, case.correct, 606), f"{case.helper}: the correct twin was flagged"
