"""Every mutant must be killed: a suite that passes against a broken lock is no evidence.

Each scenario names the mutants it must kill (``Scenario.kills``); each mutant is
run through those scenarios and must produce at least one violation in each.
The run prints the mutant table at the end. With ``FIFOLOCK_MUTANT_MATRIX=1``
every mutant runs through every scenario instead (slow; for the docs table).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.adversarial.mutants import MUTANTS
from tests.adversarial.scenarios import (
    AWAITING_MUTANTS,
    CRASH,
    KNOWN_BUG_SCENARIOS,
    REAL,
    SCENARIOS,
    Context,
    run,
)
from tests.adversarial.table import RESULTS

MATRIX = os.environ.get("FIFOLOCK_MUTANT_MATRIX") == "1"


def killers(mutant: str) -> list[str]:
    """The scenarios that must kill ``mutant`` (every scenario in matrix mode)."""
    if MATRIX:
        return list(REAL)
    return [name for name, scenario in SCENARIOS.items() if mutant in scenario.kills]


def test_every_mutant_still_applies_to_the_core() -> None:
    # Not adversarial: runs with the default suite, so a change to the core that
    # makes a mutant's snippet disappear fails at once rather than silently.
    for mutant in MUTANTS.values():
        mutant.check()


def test_every_scenario_must_kill_a_mutant_and_every_mutant_has_a_killer() -> None:
    idle = [name for name in REAL if not SCENARIOS[name].kills]
    assert idle == [], f"scenarios that kill no mutant must be removed: {idle}"
    unknown = {m for s in SCENARIOS.values() for m in s.kills} - set(MUTANTS)
    assert unknown == set(), f"scenarios name unknown mutants: {unknown}"
    orphans = [mutant for mutant in MUTANTS if not killers(mutant)]
    assert orphans == [], f"mutants no scenario is expected to kill: {orphans}"
    assert not set(KNOWN_BUG_SCENARIOS) - set(SCENARIOS)
    # Issue 11's scenarios wait for the redesign's mutants; once one names a
    # mutant it must leave AWAITING_MUTANTS and join the real-lock runs.
    assert not set(AWAITING_MUTANTS) - set(SCENARIOS)
    named = [name for name in AWAITING_MUTANTS if SCENARIOS[name].kills]
    assert named == [], f"scenarios that name a mutant must leave AWAITING_MUTANTS: {named}"


@pytest.mark.adversarial
@pytest.mark.timeout(1800 if MATRIX else 300)
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
async def test_the_mutant_is_killed_by_its_scenarios(
    mutant: str, contexts: Callable[..., Context], replay: str
) -> None:
    MUTANTS[mutant].check()
    survived = []
    for name in killers(mutant):
        outcome = await run(name, contexts(mutant=mutant))
        RESULTS.add_mutant(mutant, outcome)
        print(outcome.summary())
        if not [v for v in outcome.violations if not v.startswith(CRASH)]:
            survived.append(name)  # a crash of the scenario is no kill
    if MATRIX:
        assert len(survived) < len(killers(mutant)), f"{mutant} survived everything\n{replay}"
    else:
        assert survived == [], f"mutant {mutant} survived {survived}\n{replay}"
