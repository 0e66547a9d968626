"""The adversarial scenarios: each attacks one guarantee and returns what went wrong.

A scenario is an ``async`` function of a ``Context`` (``registry.py``) that
returns an ``Outcome``; it never asserts: the real-lock tests assert that an
outcome is clean, the mutant tests that it is not. The scenarios live by
concern - ``scenarios_fleet.py`` (real contender processes),
``scenarios_stages.py``, ``scenarios_connections.py``, ``scenarios_keys.py``,
``scenarios_input.py``, ``scenarios_protocol.py`` and ``scenarios_loops.py`` (an
in-process ``Arena``, ``arena.py``), and issue 11's fault kinds in ``late_faults.py`` - and register
themselves in ``registry.SCENARIOS`` when imported here, in this order. This
module says which of them the real lock must pass, and how.
"""

from __future__ import annotations

# Importing a scenario module registers its scenarios, in this order.
from tests.adversarial import (  # noqa: F401
    late_faults,
    scenarios_connections,
    scenarios_fleet,
    scenarios_input,
    scenarios_keys,
    scenarios_loops,
    scenarios_protocol,
    scenarios_stages,
)
from tests.adversarial.registry import CRASH, SCENARIOS, Context, Outcome, run

__all__ = ["CRASH", "SCENARIOS", "Context", "Outcome", "run"]

KNOWN_BUG_SCENARIOS = ("connection-killed-short-lease", "same-token-retry")
"""Scenarios that pinned core bugs; ``test_adversarial_regressions.py`` runs them."""

AWAITING_MUTANTS = (
    "proxy-late-copies",
    "blocked-loop-grant",
    "fork-in-hold",
    "restricted-acl",
)
"""Scenarios of issue 11's fault kinds (``late_faults.py``). The real lock must
pass them once the redesign lands (today they find issue 11's bugs). The mutants
issue 11 designates for them (a lease dated from the ring, a history bounded by
count, withdraw by token alone, no withdrawal of requests abandoned by an
outage, a fence counter that restarts at 1) target the redesigned protocol and
are written with it; until a scenario names one in ``kills`` it stays here,
exempt from the must-kill check, and ``test_adversarial_scenarios.py`` runs it
against the real lock on its own."""

REAL = [
    name for name in SCENARIOS if name not in KNOWN_BUG_SCENARIOS and name not in AWAITING_MUTANTS
]
"""Scenarios the real lock must pass, each killing at least one mutant."""

IN_PROCESS = (
    "cancel-stages",
    "connection-killed",
    "late-and-repeated-releases",
    "lease-evicted",
    "evicted-after-waiting",
    "keys-missing",
    "max-hold",
    "bad-input",
)
"""Scenarios cheap enough to run again with every script call executed twice."""
