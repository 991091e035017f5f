"""The settings of one load test, as a dataclass the registry stores with every serving benchmark."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from depthprune.core.errors import UserError


@dataclass
class LoadConfig:
    """How load is generated; every model of a comparison gets exactly this load."""

    rate: float = math.inf
    """Mean requests per second; ``inf`` sends every request at once (saturation)."""
    burstiness: float = 1.0
    """Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more even (as ``vllm bench serve``)."""
    max_concurrency: int | None = None
    """Most requests in flight from the client; None = no cap."""
    num_prompts: int = 64
    """Measured requests per model and round."""
    input_len: int = 128
    """Prompt tokens: exact for synthetic prompts, a cut for texts."""
    output_len: int = 64
    """Tokens every request generates (``max_tokens``; with ``ignore_eos`` exactly this many)."""
    warmup: int = 2
    """Unmeasured requests sent to each model before the first round."""
    settle_requests: int = 2
    """Unmeasured short requests sent to an arm right before each of its timed runs, so that its first batch
    after the other arms ran is not measured (see ``loadtest.runner.settle``); 0 = none."""
    arm_gap_s: float = 2.0
    """Pause before an arm's run (before its settling requests) when the run before it sent another model
    (and before a round's first run), so whatever that engine still does after its last response is over
    before this arm is timed. Measured on engines sharing 2 CPU cores (docs/benchmarks.md, "The pause
    between arms"): without it about a quarter of the runs right after another engine stalled ~1 s before
    their first token, with 2 s none did; 0 = no pause."""
    seed: int = 0
    """Seed of prompts and arrival times."""
    rounds: int = 3
    """Fewest interleaved rounds: each round runs every arm once, in a balanced order (loadtest.order), so
    drift and carry-over cancel; rounded up to whole blocks of that order."""
    max_rounds: int | None = None
    """Most rounds: rounds are added after ``rounds`` until every headline interval is ``target_precision``
    precise, this many rounds ran, or ``time_budget_s`` is spent; None = the larger of ``rounds`` and 30."""
    target_precision: float = 0.03
    """Wanted relative half-width of the headline 95 % intervals (each variant's throughput speed-up and the
    A/A ratio); 0 = always run ``max_rounds``."""
    stop_rule: str = "precision"
    """When rounds stop being added (``loadtest.precision``): ``precision`` once every headline interval is
    ``target_precision`` precise; ``decision`` as soon as every variant's interval excludes 1 and the A/A
    interval lies within ``1 ± aa_tolerance`` (or once precise, whichever comes first): enough to say
    *which* is faster, far sooner than ±2 %."""
    aa_tolerance: float = 0.05
    """``stop_rule`` decision: the A/A interval must lie within ``[1 / (1 + this), 1 + this]``."""
    time_budget_s: float = 600.0
    """No round is added after this many seconds of measuring (60 % for saturation when a steady-state phase
    follows); every phase still runs ``rounds`` rounds."""
    budget_cuts_blocks: bool = False
    """Once ``rounds`` rounds ran, stop at ``time_budget_s`` even inside a block of the balanced order (the
    demo, whose promise is a time): the record says the block was cut, and the A/A arm shows what that cost.
    Off, the budget is looked at only after whole blocks, so it can be overrun by a block less a round."""
    aa: bool = False
    """A/A control: the baseline measured again as its own arm in every round (the run's noise floor)."""
    steady_fraction: float = 0.5
    """With ``rate`` inf: also measure at a fixed Poisson rate of this fraction of the baseline's saturation
    request throughput, where TTFT and TPOT are steady-state; 0 = saturation only."""
    prompts: str = "synthetic"
    """``demo`` (the demo model's test text), ``synthetic``, or a file path."""
    ignore_eos: bool = True
    """Ask the server to ignore end-of-sequence so every model generates ``output_len`` tokens."""
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    """SLOs in ms for goodput: keys ``ttft``, ``tpot``, ``e2el``."""
    percentiles: tuple[float, ...] = (90.0, 99.0)
    """Latency percentiles to report."""
    request_timeout_s: float = 300.0
    """A request that takes longer fails with ``timeout``."""
    max_run_s: float = 1800.0
    """Time limit of one model's run in one round; requests still open then fail with ``run_time_limit``."""

    def __post_init__(self):
        if not self.rate > 0:
            raise UserError(f"--rate must be positive or inf, got {self.rate}")
        if not self.burstiness > 0:
            raise UserError(f"--burstiness must be positive, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UserError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if self.num_prompts < 1:
            raise UserError(f"--num-prompts must be at least 1, got {self.num_prompts}")
        if self.num_prompts > 100_000:
            raise UserError(f"--num-prompts is bounded to 100000, got {self.num_prompts}")
        if self.input_len < 1 or self.output_len < 1:
            raise UserError("--input-len and --output-len must be at least 1")
        if self.warmup < 0 or self.settle_requests < 0:
            raise UserError("--warmup and --settle-requests must be 0 or more")
        if not 0 <= self.arm_gap_s <= 60:
            raise UserError(f"--arm-gap must be between 0 and 60 seconds, not {self.arm_gap_s:g}")
        if not 1 <= self.rounds <= 100:
            raise UserError(f"--rounds must be in 1..100, got {self.rounds}")
        if self.max_rounds is None:
            self.max_rounds = max(self.rounds, 30)
        if not self.rounds <= self.max_rounds <= 200:
            raise UserError(f"--max-rounds must be in --rounds ({self.rounds})..200, got {self.max_rounds}")
        if not 0 <= self.target_precision < 1:
            raise UserError(f"--target-precision must be in [0, 1), got {self.target_precision}")
        if self.stop_rule not in ("precision", "decision"):
            raise UserError(f"--stop-rule must be precision or decision, got {self.stop_rule!r}")
        if not 0 < self.aa_tolerance < 1:
            raise UserError(f"--aa-tolerance must be in (0, 1), got {self.aa_tolerance}")
        if not self.time_budget_s > 0:
            raise UserError(f"--time-budget must be positive, got {self.time_budget_s}")
        if not 0 <= self.steady_fraction < 1:
            raise UserError(f"--steady-fraction must be in [0, 1), got {self.steady_fraction}")
        if self.request_timeout_s <= 0 or self.max_run_s <= 0:
            raise UserError("time limits must be positive")
        if any(not 0 < p < 100 for p in self.percentiles):
            raise UserError(f"percentiles must be in (0, 100), got {self.percentiles}")

    def as_dict(self) -> dict:
        """JSON-safe settings (``inf`` written as the string ``"inf"``)."""
        settings = asdict(self)
        settings["rate"] = "inf" if math.isinf(self.rate) else self.rate
        settings["burstiness"] = "inf" if math.isinf(self.burstiness) else self.burstiness
        settings["percentiles"] = list(self.percentiles)
        return settings
