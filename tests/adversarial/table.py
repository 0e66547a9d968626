"""What the adversarial run found, collected across tests and printed at the end.

The conftest prints ``summary()`` in pytest's terminal summary: the totals (scenarios
run, faults injected, record entries checked, violations) and the mutant table
(each mutant, the scenarios that ran against it, killed or not).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.adversarial.registry import CRASH, Outcome


@dataclass
class Results:
    """Outcomes of the real lock and of the mutants, in the order they ran."""

    real: list[Outcome] = field(default_factory=list)
    mutants: dict[str, list[tuple[str, bool, str]]] = field(default_factory=dict)

    def add_real(self, outcome: Outcome) -> None:
        """Record an outcome of the lock as shipped."""
        self.real.append(outcome)

    def add_mutant(self, mutant: str, outcome: Outcome) -> None:
        """Record an outcome of ``mutant``: killed when it has any violation."""
        found = [v for v in outcome.violations if not v.startswith(CRASH)]
        first = found[0] if found else "survived"
        self.mutants.setdefault(mutant, []).append((outcome.scenario, bool(found), first))

    def summary(self) -> list[str]:
        """The lines to print: totals, then the mutant table."""
        lines: list[str] = []
        if self.real:
            faults: Counter[str] = Counter()
            for outcome in self.real:
                faults.update(outcome.report.faults)
            faults.pop("scripterror", None)
            violations = sum(len(outcome.violations) for outcome in self.real)
            known = sum(len(outcome.report.known) for outcome in self.real)
            lines += [
                f"scenarios run against the real lock: {len(self.real)}",
                "faults injected or observed: "
                + (", ".join(f"{kind}={n}" for kind, n in sorted(faults.items())) or "none"),
                f"record entries checked: {sum(o.report.entries for o in self.real)} "
                f"({sum(o.report.holds for o in self.real)} holds, "
                f"{sum(o.report.requests for o in self.real)} requests)",
                f"violations found: {violations}; known core-bug findings: {known}",
                f"scenario time: {sum(o.seconds for o in self.real):.0f} s",
            ]
        if self.mutants:
            killed = sum(any(hit for _, hit, _ in runs) for runs in self.mutants.values())
            lines.append(f"mutants killed: {killed}/{len(self.mutants)}")
            width = max(len(name) for name in self.mutants)
            for mutant, runs in sorted(self.mutants.items()):
                for scenario, hit, why in runs:
                    verdict = "KILLED  " if hit else "SURVIVED"
                    lines.append(f"  {mutant:<{width}}  {verdict} by {scenario}: {why[:110]}")
        return lines


RESULTS = Results()
