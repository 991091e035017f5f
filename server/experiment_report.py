"""Per-arm results of an A/B experiment, read from the gateways' Prometheus metrics (``experiments report``).

The gateways count requests and observe TTFT, TPOT and end-to-end latency in histograms labelled by
experiment and arm (:mod:`server.metrics`). The report adds the histograms of every gateway given (replicas
behind one load balancer), then per arm gives:

* requests and errors (non-2xx answers), the error rate with its exact (Clopper-Pearson) 95 % interval;
* for each latency: the mean with a t-interval whose spread is estimated from the buckets (each observation
  at its bucket's midpoint), and the median with the distribution-free 95 % interval of order statistics
  (ranks from the binomial distribution), read off the bucket edges. A histogram cannot be more exact than
  its buckets: both intervals are as wide as the buckets make them, never narrower than the truth.

The statistics here are self-contained (scipy.stats) so that they can later be folded into the load test's.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ground.core.errors import UserError
from server.experiment_comparison import against_ideal, compare_arms
from server.metrics import MOMENTS_FAMILY
from server.sequential import QUALITY_MARGIN, Moments

PREFIX = "depthprune_gateway_"
LATENCIES = {
    "ttft": "time_to_first_token_seconds",
    "tpot": "time_per_output_token_seconds",
    "e2el": "e2e_request_latency_seconds",
}
"""Report key -> gateway histogram (without the prefix); the keys are ``vllm bench serve``'s names."""
CONFIDENCE = 0.95


@dataclass
class Histogram:
    """One latency histogram: cumulative counts per upper bucket edge, the sum and the count."""

    buckets: dict[float, float] = field(default_factory=lambda: defaultdict(float))
    total: float = 0.0
    count: float = 0.0

    def add(self, other: Histogram) -> None:
        for edge, cumulative in other.buckets.items():
            self.buckets[edge] += cumulative
        self.total += other.total
        self.count += other.count

    def counts(self) -> list[tuple[float, float, int]]:
        """``(lower edge, upper edge, observations)`` per bucket, in order (the last upper edge is inf)."""
        rows, lower, previous = [], 0.0, 0.0
        for edge in sorted(self.buckets):
            cumulative = self.buckets[edge]
            rows.append((lower, edge, round(cumulative - previous)))
            lower, previous = edge, cumulative
        return rows


def mean_interval(histogram: Histogram) -> dict[str, float | None]:
    """Mean (exact: sum / count) and its 95 % t-interval, the spread estimated from bucket midpoints."""
    from scipy import stats

    n = int(histogram.count)
    if n == 0:
        return {"mean": None, "low": None, "high": None}
    mean = histogram.total / n
    if n == 1:
        return {"mean": mean, "low": None, "high": None}
    squares = 0.0
    for lower, upper, count in histogram.counts():
        middle = lower if math.isinf(upper) else (lower + upper) / 2  # the open bucket: its lower edge
        squares += count * (middle - mean) ** 2
    half = stats.t.ppf((1 + CONFIDENCE) / 2, n - 1) * math.sqrt(squares / (n - 1)) / math.sqrt(n)
    return {"mean": mean, "low": max(0.0, mean - half), "high": mean + half}


def median_interval(histogram: Histogram) -> dict[str, float | None]:
    """Median (interpolated within its bucket, as PromQL's histogram_quantile) and its distribution-free
    95 % interval: the order statistics of ranks ``binom.ppf(0.025, n, 1/2)`` and ``binom.ppf(0.975, n,
    1/2) + 1``, widened to the edges of the buckets holding them (None where that is the open bucket)."""
    from scipy import stats

    n = int(histogram.count)
    if n == 0:
        return {"p50": None, "low": None, "high": None}
    rows = histogram.counts()
    low_rank = max(1, int(stats.binom.ppf((1 - CONFIDENCE) / 2, n, 0.5)))
    high_rank = min(n, int(stats.binom.ppf((1 + CONFIDENCE) / 2, n, 0.5)) + 1)
    seen, median, low, high = 0, None, None, None
    for lower, upper, count in rows:
        if count == 0:
            continue
        if median is None and seen + count >= n / 2:
            fraction = (n / 2 - seen) / count
            median = lower if math.isinf(upper) else lower + fraction * (upper - lower)
        if low is None and seen + count >= low_rank:
            low = lower
        if high is None and seen + count >= high_rank:
            high = None if math.isinf(upper) else upper
            break
        seen += count
    return {"p50": median, "low": low, "high": high}


def error_interval(errors: int, requests: int) -> dict[str, float | None]:
    """Error rate and its exact (Clopper-Pearson) 95 % interval."""
    from scipy import stats

    if requests == 0:
        return {"rate": None, "low": None, "high": None}
    interval = stats.binomtest(errors, requests).proportion_ci(CONFIDENCE, method="exact")
    return {"rate": errors / requests, "low": interval.low, "high": interval.high}


@dataclass
class ArmTraffic:
    """What the gateways measured for one arm."""

    requests: int = 0
    errors: int = 0
    variants: set[str] = field(default_factory=set)
    """The variants that answered its requests (its own, and a fallback's while it was down)."""
    latencies: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))
    moments: dict[str, Moments] = field(default_factory=dict)
    """Sufficient statistics per measure (``dense_nll``, ``top1_agreement``, ``tpot``, ``e2el``)."""
    shadow_scored: int = 0
    shadow_dropped: int = 0


def arm_traffic(metrics_texts: list[str], experiment: str) -> dict[str, ArmTraffic]:
    """Per-arm traffic of ``experiment`` summed over the gateways' ``/metrics`` texts."""
    arms: dict[str, ArmTraffic] = defaultdict(ArmTraffic)
    histogram_names = {PREFIX + name: key for key, name in LATENCIES.items()}
    for text in metrics_texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("experiment") != experiment or not labels.get("arm"):
                    continue
                arm = arms[labels["arm"]]
                if sample.name == PREFIX + MOMENTS_FAMILY + "_total":
                    _add_moment(arm.moments, labels["measure"], labels["moment"], sample.value)
                elif sample.name == PREFIX + "shadow_scored_total":
                    arm.shadow_scored += int(sample.value)
                elif sample.name == PREFIX + "shadow_dropped_total":
                    arm.shadow_dropped += int(sample.value)
                elif sample.name == PREFIX + "requests_total":
                    arm.requests += int(sample.value)
                    arm.errors += 0 if labels["status"].startswith("2") else int(sample.value)
                    arm.variants.add(labels["variant"])
                elif family.name in histogram_names:
                    histogram = arm.latencies[histogram_names[family.name]]
                    if sample.name.endswith("_bucket"):
                        histogram.buckets[float(labels["le"])] += sample.value
                    elif sample.name.endswith("_sum"):
                        histogram.total += sample.value
                    elif sample.name.endswith("_count"):
                        histogram.count += sample.value
    return dict(arms)


def _add_moment(moments: dict[str, Moments], measure: str, moment: str, value: float) -> None:
    part = {"count": Moments(count=value), "sum": Moments(total=value), "sum_squares": Moments(squares=value)}
    moments[measure] = moments.get(measure, Moments()) + part.get(moment, Moments())


def arm_summary(traffic: ArmTraffic) -> dict[str, Any]:
    """JSON-ready numbers of one arm: requests, errors with interval, each latency's mean and median."""
    summary: dict[str, Any] = {
        "requests": traffic.requests,
        "errors": traffic.errors,
        "error_rate": error_interval(traffic.errors, traffic.requests),
        "variants": sorted(traffic.variants),
        "shadow_scored": traffic.shadow_scored,
        "shadow_dropped": traffic.shadow_dropped,
        # The sufficient statistics every sequence and verdict is computed from, so that a reader of the JSON
        # can recompute (or add another report's) without the gateways
        "moments": {measure: asdict(moments) for measure, moments in sorted(traffic.moments.items())},
    }
    for key in LATENCIES:
        histogram = traffic.latencies.get(key, Histogram())
        summary[key] = {
            "count": int(histogram.count),
            "mean_s": mean_interval(histogram),
            "median_s": median_interval(histogram),
        }
    return summary


# ---------------------------------------------------------------- the report of one experiment


def report(
    name: str, gateways: list[str], *, api_key: str | None = None, registry_url: str | None = None
) -> dict[str, Any]:
    """Per-arm traffic of ``name`` on ``gateways`` and each arm's variant facts.

    Raises:
        UserError: a gateway does not answer ``/metrics``, or no gateway knows the experiment.
    """
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    texts, cards = [], {}
    for url in (url.rstrip("/") for url in gateways):
        texts.append(_get(httpx, f"{url}/metrics", headers).text)
        if not cards:
            with contextlib.suppress(UserError):
                cards = {card["id"]: card for card in _get(httpx, f"{url}/v1/models", headers).json()["data"]}
    spec, evaluations, changes = _registry_facts(name, registry_url)
    arms = _arms(name, spec, cards.get(name))
    traffic = arm_traffic(texts, name)
    if not arms and not traffic:
        raise UserError(f"no gateway given routes experiment {name!r}, and the registry does not know it")
    comparison = _comparison(spec, cards.get(name))
    order = [*arms, *sorted(set(traffic) - set(arms))]
    moments = {arm: traffic[arm].moments for arm in traffic}
    compared = compare_arms(moments, order, comparison["control"], comparison["margin"])
    stops = guardrail_stops(changes)
    rows = []
    for arm_name in order:
        arm = arms.get(arm_name, {"name": arm_name})
        summary = arm_summary(traffic.get(arm_name, ArmTraffic()))
        variant = arm.get("variant") or (summary["variants"][0] if summary["variants"] else None)
        card = cards.get(variant, {})
        facts = {key: card.get(key) for key in ("base_model", "objective", "removed_blocks", "num_blocks")}
        facts["held_out"] = evaluations(card, variant) if variant else []
        row = {**arm, **summary, **compared[arm_name], "variant": variant, "facts": facts}
        if "vs_control" in row:
            row["vs_control"]["guardrail"] = stops.get(arm_name, {"fired": False})
        rows.append(row)
    _check_ideal(rows, comparison["control"])
    return {"experiment": name, **comparison, "gateways": list(gateways), "arms": rows}


def _check_ideal(rows: list[dict[str, Any]], control: str | None) -> None:
    """Each compared arm's ``ideal_tpot_ratio`` and whether its TPOT ratio is ``beyond_ideal``."""
    control_facts = next((row["facts"] for row in rows if row["name"] == control), {})
    for row in rows:
        if "vs_control" in row:
            row["vs_control"].update(against_ideal(row["facts"], control_facts, row["vs_control"]))


def _comparison(spec: dict | None, card: dict | None) -> dict[str, Any]:
    """The control, margin, shadow rate and guardrails: a gateway's card says them as it resolved them
    (the default control included); the registry's spec when no gateway routes the experiment."""
    if card and card.get("comparison"):
        return dict(card["comparison"])
    spec = spec or {}
    return {
        "control": spec.get("control"),
        "shadow_rate": spec.get("shadow_rate", 0.0),
        "margin": spec.get("margin", QUALITY_MARGIN),
        "guardrails": spec.get("guardrails"),
    }


def guardrail_stops(changes: list) -> dict[str, dict[str, Any]]:
    """Per arm, the last time a guardrail stopped it: ``{fired, version, reason}`` from the history (the arm
    whose weight the change set to 0)."""
    stops = {}
    for change in changes:
        if change.actor != "guardrail" or not change.old_spec or not change.new_spec:
            continue
        before = {arm["name"]: arm.get("weight", 1.0) for arm in change.old_spec.get("arms", [])}
        for arm in change.new_spec.get("arms", []):
            if arm.get("weight") == 0 and before.get(arm["name"], 0) > 0:
                stops[arm["name"]] = {"fired": True, "version": change.version, "reason": change.reason}
    return stops


def _get(httpx, url: str, headers: dict):
    try:
        response = httpx.get(url, headers=headers, timeout=10)
    except httpx.HTTPError as error:
        raise UserError(f"{url} did not answer: {type(error).__name__}: {error}") from None
    if response.status_code != 200:
        raise UserError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return response


def _arms(name: str, spec: dict | None, card: dict | None) -> dict[str, dict]:
    """Each arm's target and share, from the registry's spec, else from a gateway's ``/v1/models``."""
    if spec is not None:
        total = sum(arm["weight"] for arm in spec["arms"]) or 1
        return {
            arm["name"]: {
                "name": arm["name"],
                "target": arm.get("variant") or f"objective {arm['objective']}",
                "share": arm["weight"] / total,
            }
            for arm in spec["arms"]
        }
    arms = (card or {}).get("arms") or []
    return {
        arm["name"]: {
            "name": arm["name"],
            "target": arm["variant"],
            "share": arm["share"],
            "variant": arm["variant"],
        }
        for arm in arms
    }


def _registry_facts(name: str, registry_url: str | None):
    """The experiment's spec in the registry (None when it is not there), and a reader of held-out quality."""
    from registry.api import open_registry
    from registry.experiments import ExperimentNotFound, ExperimentStore

    try:
        registry = open_registry(registry_url)
    except UserError:
        return None, lambda card, variant: [], []
    store = ExperimentStore(registry)
    try:
        spec = store.get(name).spec
    except ExperimentNotFound:
        spec = None

    def evaluations(card: dict, variant: str) -> list[dict]:
        reference = card.get("variant_id") or variant
        if reference == "dense" and card.get("base_model"):
            reference = f"dense@{card['base_model']}"
        try:
            found = registry.evaluations(reference)
        except UserError:
            return []
        return [{"suite": e.suite, "task": e.task, "metric": e.metric, "value": e.value} for e in found]

    return spec, evaluations, store.history(name)


def print_report(result: dict[str, Any], console) -> None:
    """The report as tables that read whole at 100 columns: traffic, latency (fixed-horizon intervals of
    this moment), the arms' variants, then quality and speed against the control (confidence sequences)."""
    from rich import box
    from rich.table import Table

    style = {"box": box.SIMPLE_HEAD, "padding": (0, 1), "title_justify": "left"}
    traffic = Table(title=f"experiment {result['experiment']}: traffic per arm", **style)
    for column in ("arm", "share", "served by", "requests", "errors (95 % interval)"):
        traffic.add_column(column, no_wrap=True)
    latency = Table(title="latency per arm, ms (95 % intervals)", **style)
    for column in ("arm", *_LATENCY_COLUMNS):
        latency.add_column(column, no_wrap=True)
    facts = Table(title="the arms' variants", **style)
    for column in ("arm", "variant", "objective", "removed blocks", "held-out quality"):
        facts.add_column(column)
    for arm in result["arms"]:
        rate = arm["error_rate"]
        errors = f"{arm['errors']} ({_pct(rate['rate'])} [{_pct(rate['low'])}, {_pct(rate['high'])}])"
        share = _pct(arm.get("share"))
        traffic.add_row(arm["name"], share, ", ".join(arm["variants"]) or "—", str(arm["requests"]), errors)
        latency.add_row(arm["name"], *[_ms(arm[key][kind]) for key, kind in _LATENCY_KEYS])
        f = arm["facts"]
        known = f["num_blocks"] or f["removed_blocks"]  # a bare remote backend's card says neither
        removed = f"{f['removed_blocks']} of {f['num_blocks'] or '?'}" if known else "—"
        quality = "; ".join(f"{e['task']} {e['metric']}={e['value']:.4g}" for e in f["held_out"][:4]) or "—"
        facts.add_row(arm["name"], arm["variant"] or "—", f["objective"] or "—", removed, quality)
    for table in (traffic, latency, facts):
        console.print(table)
    print_comparison(result, console)


def print_comparison(result: dict[str, Any], console) -> None:
    """Quality (shadow-scored) and speed of every arm against the control, with confidence sequences."""
    from rich import box
    from rich.table import Table

    control = result.get("control") or "?"
    margin = result.get("margin", QUALITY_MARGIN)
    style = {"box": box.SIMPLE_HEAD, "padding": (0, 1), "title_justify": "left"}
    quality = Table(title=f"quality vs control '{control}' (nats/token; margin {margin:g})", **style)
    for column in ("arm", "scored (dropped)", "NLL delta", "top-1 agreement", "verdict"):
        quality.add_column(column, no_wrap=True)
    speed = Table(title=f"speed vs control '{control}' (arm / control)", **style)
    for column in ("arm", "TPOT ratio", "E2EL ratio", "verdict", "guardrail"):
        speed.add_column(column, no_wrap=True)
    for arm in result["arms"]:
        versus = arm.get("vs_control")
        quality.add_row(
            arm["name"] + (" (control)" if versus is None else ""),
            f"{arm['shadow_scored']} ({arm['shadow_dropped']})",
            _with_cs(versus["nll_delta"], versus["nll_delta_cs95"], signed=True) if versus else "—",
            _with_cs(arm["top1_agreement"], arm["top1_agreement_cs95"]),
            versus["quality"] if versus else "—",
        )
        if versus is None:
            continue
        stop = versus.get("guardrail") or {}
        speed.add_row(
            arm["name"],
            _with_cs(versus["tpot_ratio"], versus["tpot_ratio_cs95"]),
            _with_cs(versus["e2el_ratio"], versus["e2el_ratio_cs95"]),
            versus["speed"],
            f"stopped (v{stop['version']})" if stop.get("fired") else "—",
        )
    console.print(quality)
    console.print(speed)
    console.print("[ ] 95 % confidence sequences: valid however often the report is read")
    for arm in result["arms"]:
        versus = arm.get("vs_control") or {}
        stop = versus.get("guardrail") or {}
        if stop.get("fired"):
            console.print(f"guardrail, version {stop['version']}: {stop['reason']}")
        if versus.get("beyond_ideal"):
            console.print(
                f"{arm['name']}: TPOT ratio wholly below {versus['ideal_tpot_ratio']:.3f}, the most its "
                "removed blocks can give: a measurement artefact until explained, not a gain"
            )
    if (result.get("shadow_rate") or 0) > 0:
        console.print(
            f"shadow_rate {result['shadow_rate']:g}: the control's engine also scores the arms' answers, "
            "which slows the control and so flatters every other arm's speed ratios (docs/experiments.md)"
        )


def _with_cs(value: float | None, bounds: list[float] | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    form = "{:+.2f}" if signed else "{:.2f}"
    shown = form.format(value)
    return shown if bounds is None else f"{shown} [{form.format(bounds[0])}, {form.format(bounds[1])}]"


_LATENCY_KEYS = [("ttft", "mean_s"), ("tpot", "mean_s"), ("e2el", "mean_s"), ("e2el", "median_s")]
_LATENCY_COLUMNS = ["TTFT mean", "TPOT mean", "E2EL mean", "E2EL p50"]
"""The text form's latency columns (the JSON has the TTFT median too): four fit 100 columns whole."""


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _ms(stat: dict) -> str:
    value = stat.get("mean", stat.get("p50"))
    if value is None:
        return "—"

    def show(x):
        return "?" if x is None else f"{x * 1000:.3g}"

    return f"{show(value)} [{show(stat['low'])}, {show(stat['high'])}]"
