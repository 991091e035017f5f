"""The settings of one load test, as a dataclass the registry stores with every serving benchmark.

Its fields are also ``depthprune loadtest``'s options (:mod:`ground.core.cli_options`): each field's
``cli`` metadata holds what the command line says differently (its help, name or typed form).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ground.core.cli_options import cli
from ground.core.errors import UserError
from ground.core.options import SEED_HELP


def parse_rate(text: str) -> float:
    """``"inf"`` or a positive number of requests per second."""
    try:
        rate = float(text)
    except ValueError:
        raise UserError(f"--rate must be a number of requests per second or 'inf', got {text!r}") from None
    if not rate > 0:
        raise UserError(f"--rate must be positive or inf, got {text!r}")
    return rate


def parse_goodput_slos(specs: list[str] | None) -> dict[str, float]:
    """``--goodput`` SLOs in ms (``["ttft:500 tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}``).

    Raises:
        UserError: a malformed SLO.
    """
    from loadtest.metrics import parse_goodput

    try:
        return parse_goodput(specs or [])
    except ValueError as error:
        raise UserError(str(error)) from None


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``--percentiles`` (``"90,99"`` -> ``(90.0, 99.0)``).

    Raises:
        UserError: an item that is not a number.
    """
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError as error:
        raise UserError(str(error)) from None


@dataclass
class LoadConfig:
    """How load is generated; every model of a comparison gets exactly this load."""

    rate: float = field(
        default=math.inf,
        metadata=cli(
            type=str,
            default="inf",
            parse=parse_rate,
            help="Requests per second, or 'inf' to send all at once (saturation).",
        ),
    )
    """Mean requests per second; ``inf`` sends every request at once (saturation)."""
    burstiness: float = field(
        default=1.0, metadata=cli(help="Gamma shape of arrival gaps: 1 = Poisson, <1 burstier.")
    )
    """Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more even (as ``vllm bench serve``)."""
    max_concurrency: int | None = field(
        default=None, metadata=cli(help="Most requests in flight (default: no cap).")
    )
    """Most requests in flight from the client; None = no cap."""
    num_prompts: int = field(default=64, metadata=cli())
    """Measured requests per model and round."""
    input_len: int = field(
        default=128, metadata=cli(help="Prompt tokens (exact for synthetic prompts, a cut for texts).")
    )
    """Prompt tokens: exact for synthetic prompts, a cut for texts."""
    output_len: int = field(
        default=64, metadata=cli(help="Tokens each request generates (ignore_eos keeps it exact).")
    )
    """Tokens every request generates (``max_tokens``; with ``ignore_eos`` exactly this many)."""
    warmup: int = field(default=2, metadata=cli(help="Unmeasured warm-up requests per model."))
    """Unmeasured requests sent to each model before the first round."""
    settle_requests: int = field(
        default=2, metadata=cli(help="Unmeasured short requests to an arm right before each of its runs.")
    )
    """Unmeasured short requests sent to an arm right before each of its timed runs, so that its first batch
    after the other arms ran is not measured (see ``loadtest.runner.settle``); 0 = none."""
    arm_gap_s: float = field(
        default=2.0,
        metadata=cli(
            name="arm_gap",
            help="Seconds to pause before an arm's run when the run before it sent another model, so that "
            "engine is idle first (0 = none; docs/benchmarks.md).",
        ),
    )
    """Pause before an arm's run (before its settling requests) when the run before it sent another model
    (and before a round's first run), so whatever that engine still does after its last response is over
    before this arm is timed. Measured on engines sharing 2 CPU cores (docs/benchmarks.md, "The pause
    between arms"): without it about a quarter of the runs right after another engine stalled ~1 s before
    their first token, with 2 s none did; 0 = no pause."""
    seed: int = field(default=0, metadata=cli(help=SEED_HELP))
    """Seed of prompts and arrival times."""
    rounds: int = field(
        default=3, metadata=cli(help="Fewest interleaved rounds; ratios are per round, so drift cancels.")
    )
    """Fewest interleaved rounds: each round runs every arm once, in a balanced order (loadtest.order), so
    drift and carry-over cancel; rounded up to whole blocks of that order."""
    max_rounds: int | None = field(
        default=None,
        metadata=cli(
            help="Most rounds (default: 30 or --rounds): rounds are added until --target-precision."
        ),
    )
    """Most rounds: rounds are added after ``rounds`` until every headline interval is ``target_precision``
    precise, this many rounds ran, or ``time_budget_s`` is spent; None = the larger of ``rounds`` and 30."""
    target_precision: float = field(
        default=0.03,
        metadata=cli(
            help="Wanted relative half-width of the headline 95 % intervals (speed-ups and A/A); "
            "0 = run --max-rounds."
        ),
    )
    """Wanted relative half-width of the headline 95 % intervals (each variant's throughput speed-up and the
    A/A ratio); 0 = always run ``max_rounds``."""
    stop_rule: str = field(
        default="precision",
        metadata=cli(
            help="precision: add rounds until every headline interval is --target-precision precise; "
            "decision: stop as soon as every variant's interval excludes 1 and the A/A one is within "
            "±--aa-tolerance."
        ),
    )
    """When rounds stop being added (``loadtest.precision``): ``precision`` once every headline interval is
    ``target_precision`` precise; ``decision`` as soon as every variant's interval excludes 1 and the A/A
    interval lies within ``1 ± aa_tolerance`` (or once precise, whichever comes first): enough to say
    *which* is faster, far sooner than ±2 %."""
    aa_tolerance: float = field(
        default=0.05,
        metadata=cli(help="--stop-rule decision: how close to 1 the A/A interval must lie (0.05 = ±5 %)."),
    )
    """``stop_rule`` decision: the A/A interval must lie within ``[1 / (1 + this), 1 + this]``."""
    time_budget_s: float = field(
        default=600.0,
        metadata=cli(
            name="time_budget",
            help="Seconds after which no round is added (60 % for saturation, then steady).",
        ),
    )
    """No round is added after this many seconds of measuring (60 % for saturation when a steady-state phase
    follows); every phase still runs ``rounds`` rounds."""
    budget_cuts_blocks: bool = field(
        default=False,
        metadata=cli(
            "--budget-cuts-blocks",
            help="Once --rounds ran, stop at --time-budget even inside a block of the balanced arm order "
            "(the record says so); without it the budget is looked at after whole blocks only.",
        ),
    )
    """Once ``rounds`` rounds ran, stop at ``time_budget_s`` even inside a block of the balanced order (the
    demo, whose promise is a time): the record says the block was cut, and the A/A arm shows what that cost.
    Off, the budget is looked at only after whole blocks, so it can be overrun by a block less a round."""
    aa: bool = field(
        default=False,
        metadata=cli(
            "--aa", help="A/A control: measure the baseline again as its own arm (the noise floor)."
        ),
    )
    """A/A control: the baseline measured again as its own arm in every round (the run's noise floor)."""
    steady_fraction: float = field(
        default=0.5,
        metadata=cli(
            help="With --rate inf, also measure at this fraction of the baseline's saturation request rate "
            "(Poisson; steady-state TTFT and TPOT); 0 = no."
        ),
    )
    """With ``rate`` inf: also measure at a fixed Poisson rate of this fraction of the baseline's saturation
    request throughput, where TTFT and TPOT are steady-state; 0 = saturation only."""
    prompts: str = field(
        default="synthetic",
        metadata=cli(
            help="'synthetic', 'pydoc' (Python's documentation), 'demo' (demo model test text), "
            "or a file (JSON Lines with prompt/text, or one prompt per line)."
        ),
    )
    """``demo`` (the demo model's test text), ``synthetic``, or a file path."""
    ignore_eos: bool = field(default=True, metadata=cli(help="Generate exactly --output-len tokens."))
    """Ask the server to ignore end-of-sequence so every model generates ``output_len`` tokens."""
    goodput_slos_ms: dict[str, float] = field(
        default_factory=dict,
        metadata=cli(
            name="goodput",
            type=list[str] | None,
            default=None,
            parse=parse_goodput_slos,
            help="SLOs for goodput in ms, e.g. 'ttft:500 tpot:50'.",
        ),
    )
    """SLOs in ms for goodput: keys ``ttft``, ``tpot``, ``e2el``."""
    percentiles: tuple[float, ...] = field(
        default=(90.0, 99.0),
        metadata=cli(
            type=str, default="90,99", parse=parse_percentiles, help="Comma-separated latency percentiles."
        ),
    )
    """Latency percentiles to report."""
    request_timeout_s: float = field(
        default=300.0, metadata=cli(name="request_timeout", help="Seconds before one request fails.")
    )
    """A request that takes longer fails with ``timeout``."""
    max_run_s: float = field(
        default=1800.0,
        metadata=cli(name="max_run_time", help="Seconds one model's run may take in one round."),
    )
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
