"""The real lock against every adversarial scenario: no violation may be found.

Each scenario is described in its ``scenarios_*.py`` module and in ``README.md`` here; each is
shown to be able to fail by ``test_adversarial_mutants.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.adversarial.scenarios import AWAITING_MUTANTS, IN_PROCESS, REAL, Context, run
from tests.adversarial.table import RESULTS

pytestmark = pytest.mark.adversarial


@pytest.mark.parametrize("name", REAL)
async def test_the_real_lock_shows_no_violation(
    name: str, contexts: Callable[..., Context], replay: str
) -> None:
    outcome = await run(name, contexts())
    RESULTS.add_real(outcome)
    print(outcome.summary())
    for finding in outcome.report.known:
        print(f"  known core bug: {finding}")
    assert outcome.violations == [], f"{outcome.summary()}\n{replay}"


@pytest.mark.parametrize("name", IN_PROCESS)
async def test_the_real_lock_shows_no_violation_when_every_script_call_runs_twice(
    name: str, contexts: Callable[..., Context], replay: str
) -> None:
    outcome = await run(name, contexts(dup_exec=True))
    outcome.scenario += " (every call twice)"
    RESULTS.add_real(outcome)
    print(outcome.summary())
    assert outcome.violations == [], f"{outcome.summary()}\n{replay}"


@pytest.mark.parametrize("name", AWAITING_MUTANTS)
async def test_the_real_lock_shows_no_violation_under_issue_11_faults(
    name: str, contexts: Callable[..., Context], replay: str
) -> None:
    # Issue 11's fault kinds: they find its bugs in today's lock; the redesign must
    # pass them. Their mutants come with the redesign (see AWAITING_MUTANTS).
    outcome = await run(name, contexts())
    RESULTS.add_real(outcome)
    print(outcome.summary())
    assert outcome.violations == [], f"{outcome.summary()}\n{replay}"
