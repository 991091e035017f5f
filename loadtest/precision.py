"""When to stop adding rounds: the headline intervals are precise enough, or rounds or time ran out.

The headline ratios are each variant's ratio to the baseline of one key (output throughput at saturation,
mean TPOT at the steady rate) and, with ``--aa``, the A/A arm's ratio of the same key. Rounds are added one at
a time after ``LoadConfig.rounds`` until every headline interval's relative half-width
(:attr:`loadtest.intervals.RatioEstimate.precision`) is at most ``target_precision``, ``max_rounds`` ran, or
the ``time_budget_s`` of the whole measurement is spent.

Rounds come in blocks (:mod:`loadtest.order`): a measurement stops only after a whole block, so every arm has
run in every position and after every other arm equally often. ``rounds`` is rounded up and ``max_rounds``
down to whole blocks (``max_rounds`` below one block stays as given, and the record says the design is cut);
the time budget is checked only at the end of a block, so it can be overrun by at most one block less a round
(``--budget-cuts-blocks``: after ``rounds`` rounds, at the end of any round, for a caller whose promise is a
time, such as ``depthprune demo``).

``--stop-rule decision`` (what ``depthprune demo`` uses) also stops as soon as the run has *decided*: every
variant's headline interval excludes 1 (it is faster, or slower, than the baseline) and the A/A interval lies
within ``1 ± --aa-tolerance`` (the comparison is sound to that tolerance). Looking after every block and
stopping at the first decision is a sequential rule: each look is one more chance for a noisy interval to
exclude 1, so it is meant for differences much larger than the intervals (a 25 % pruned model against dense),
not for telling 1.02x from 1.00x; for that, the precision rule with its ±2 % and more rounds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from loadtest.compare import ratio_estimates
from loadtest.config import LoadConfig
from loadtest.intervals import RatioEstimate
from loadtest.order import block_rounds


@dataclass
class StopRule:
    """The stopping rule of one measurement phase (saturation or steady state)."""

    config: LoadConfig
    """Rounds, precision and time budget."""
    baseline: str
    """The arm the others are divided by."""
    key: str
    """The headline metric of the phase (``output_throughput`` or ``mean_tpot_ms``)."""
    deadline: float
    """``time.monotonic()`` after which no round starts (beyond ``config.rounds``)."""
    reason: str | None = None
    """Why the phase stopped, once it has."""
    reached: dict[str, float | None] = field(default_factory=dict)
    """``arm -> precision reached`` of each headline ratio at the last check."""

    block: int = 1
    """Rounds in one balanced block of the arm order (set from the arms at the first check)."""
    arms: tuple[str, ...] = ()
    """The arms in the order :func:`loadtest.order.round_order` was given them (recorded, so the order of
    every round can be rebuilt from the result)."""
    aa_arm: str | None = None
    """The A/A arm, whose interval the decision rule holds to ``aa_tolerance`` rather than to excluding 1."""

    def limits(self, arms: int) -> tuple[int, int]:
        """The fewest and most rounds for ``arms`` arms: ``rounds`` up and ``max_rounds`` down to blocks."""
        self.block = block_rounds(arms)
        return round_limits(self.config.rounds, self.config.max_rounds, self.block)

    def __call__(self, per_round: dict[str, list[dict]]) -> str | None:
        """Why to stop after the rounds in ``per_round`` (``arm -> [metrics of each round]``), or None."""
        rounds = len(per_round[self.baseline])
        fewest, most = self.limits(len(per_round))
        estimates = headline_estimates(per_round, self.baseline, self.key)
        self.reached = {arm: estimate.precision for arm, estimate in estimates.items()}
        worst = max((p if p is not None else float("inf") for p in self.reached.values()), default=0.0)
        if rounds < most and (rounds < fewest or rounds % self.block):
            if (
                self.config.budget_cuts_blocks
                and rounds >= self.config.rounds
                and time.monotonic() >= self.deadline
            ):
                self.reason = (
                    f"--time-budget {self.config.time_budget_s:g} s spent after {rounds} rounds (inside a "
                    f"block of {self.block}: the order is balanced over whole blocks only)"
                )
            return self.reason
        if self.config.target_precision > 0 and worst <= self.config.target_precision:
            self.reason = f"target precision ±{self.config.target_precision:.1%} reached"
        elif self.config.stop_rule == "decision" and self.decided(estimates):
            self.reason = (
                "decided: every variant's interval excludes 1 and the A/A interval is within "
                f"±{self.config.aa_tolerance:.0%}"
            )
        elif rounds >= most:
            self.reason = f"--max-rounds {self.config.max_rounds} reached" + (
                f" ({most} rounds: whole blocks of {self.block})" if most != self.config.max_rounds else ""
            )
        elif time.monotonic() >= self.deadline:
            self.reason = f"--time-budget {self.config.time_budget_s:g} s spent"
        return self.reason

    def decided(self, estimates: dict[str, RatioEstimate]) -> bool:
        """Whether every variant's interval excludes 1 and the A/A interval is within ``1 ± aa_tolerance``."""
        tolerance = 1 + self.config.aa_tolerance
        for arm, estimate in estimates.items():
            if estimate.low is None:
                return False
            if arm == self.aa_arm:
                if not (1 / tolerance <= estimate.low and estimate.high <= tolerance):
                    return False
            elif estimate.holds(1.0):
                return False
        return True

    def record(self) -> dict:
        """What the result JSON records of the phase: key, precision wanted and reached, why it ended."""
        values = [p for p in self.reached.values() if p is not None]
        return {
            "headline": self.key,
            "target": self.config.target_precision,
            "rule": self.config.stop_rule,
            "reached": max(values) if len(values) == len(self.reached) and values else None,
            "per_arm": self.reached,
            "stop_reason": self.reason,
            "order": {"design": "williams", "block_rounds": self.block, "arms": list(self.arms)},
        }


def round_limits(rounds: int, max_rounds: int, block: int) -> tuple[int, int]:
    """The fewest and most rounds a measurement runs: ``rounds`` up and ``max_rounds`` down to whole blocks of
    ``block`` rounds (``max_rounds`` below one block stays as given: the design is cut)."""
    most = max_rounds - max_rounds % block if max_rounds >= block else max_rounds
    fewest = -(-rounds // block) * block
    return min(fewest, most), most


def headline_estimates(per_round: dict[str, list[dict]], baseline: str, key: str) -> dict[str, RatioEstimate]:
    """``arm -> estimate of its ratio of key to the baseline``, for every arm but the baseline."""
    return {arm: per_key[key] for arm, per_key in ratio_estimates(per_round, baseline, (key,)).items()}
