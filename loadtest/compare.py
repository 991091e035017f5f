"""Compare variants with the dense model: measured ratios next to the ideal N/(N-M).

Removing M of N blocks makes the block stack N/(N-M) times cheaper; embeddings, LM head, sampling and
serving overheads do not shrink, so that is the ceiling of the speedup (SLEB measured 1.27x for 20% of the
blocks of LLaMA-2-70B, against an ideal 1.25x). Ratios are taken per round (variant and dense measured
back to back under the same load) and combined by the geometric mean, so machine drift between rounds
cancels; each ratio carries a 95 % interval from the spread of its per-round log-ratios
(:mod:`loadtest.intervals`).

``fraction_of_ideal_speedup`` = measured output-throughput speedup / ideal speedup; ``fraction_of_ideal_gain``
= (speedup - 1) / (ideal - 1), the stricter reading (0 = no gain, 1 = all of the ideal gain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ground.core.errors import UserError
from loadtest.intervals import RatioEstimate, estimate_ratio, speedup_verdict

THROUGHPUT_KEYS = ("request_throughput", "output_throughput", "total_token_throughput")
"""Higher is better; the ideal ratio is N/(N-M)."""
LATENCY_KEYS = tuple(
    f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")
)
"""Lower is better; the ideal ratio is (N-M)/N (TTFT also has fixed per-request costs)."""
AA_KEYS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
"""The ratios the A/A control reports (``aa["<key>_ratio"]`` and ``aa["<key>_ratio_ci95"]``)."""


@dataclass(frozen=True)
class BlockCounts:
    """How deep a served model is relative to its base."""

    num_blocks: int
    """N, blocks of the dense base model."""
    removed: int
    """M, blocks removed (0 for the dense model)."""
    source: str = ""
    """Where N and M came from (``registry``, ``/v1/models``, ``pruning.json``, ``--blocks``)."""

    def __post_init__(self):
        if self.num_blocks < 1 or not 0 <= self.removed < self.num_blocks:
            raise UserError(f"block counts N={self.num_blocks}, M={self.removed} need N >= 1 and 0 <= M < N")

    @property
    def ideal_speedup(self) -> float:
        """N / (N - M)."""
        return self.num_blocks / (self.num_blocks - self.removed)


def parse_blocks_overrides(specs: Sequence[str]) -> dict[str, BlockCounts]:
    """``["dense=16:0", "v25=16:4"]`` (or comma-separated) -> ``{name: BlockCounts}``."""
    overrides: dict[str, BlockCounts] = {}
    for spec in (part for item in specs for part in item.split(",") if part.strip()):
        name, sep, counts = spec.strip().partition("=")
        n, colon, m = counts.partition(":")
        try:
            if not (sep and colon and name):
                raise ValueError
            overrides[name] = BlockCounts(int(n), int(m), source="--blocks")
        except ValueError:
            raise UserError(f"--blocks {spec!r} must look like NAME=N:M (e.g. ppl-best=16:4)") from None
    return overrides


def geometric_mean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values; None when there are none."""
    positive = [value for value in values if value and value > 0 and math.isfinite(value)]
    if not positive:
        return None
    return math.exp(sum(math.log(value) for value in positive) / len(positive))


def ratio_estimates(
    per_round_metrics: dict[str, list[dict]],
    baseline: str,
    keys: Sequence[str] = THROUGHPUT_KEYS + LATENCY_KEYS,
) -> dict[str, dict[str, RatioEstimate]]:
    """``model -> {key: estimate of model[key] / baseline[key]}`` from the per-round ratios, per other model.

    Args:
        per_round_metrics: ``model -> [metrics of round 0, round 1, ...]`` (same rounds for every model).
        baseline: The model the others are divided by (the dense model).
        keys: Metric keys to compare.
    """
    base_rounds = per_round_metrics[baseline]
    estimates: dict[str, dict[str, RatioEstimate]] = {}
    for model, rounds in per_round_metrics.items():
        if model == baseline:
            continue
        estimates[model] = {
            key: estimate_ratio(
                [
                    variant[key] / base[key]
                    for variant, base in zip(rounds, base_rounds)
                    if base.get(key) and variant.get(key) is not None
                ]
            )
            for key in keys
        }
    return estimates


def ratios_to_baseline(
    per_round_metrics: dict[str, list[dict]],
    baseline: str,
    keys: Sequence[str] = THROUGHPUT_KEYS + LATENCY_KEYS,
) -> dict[str, dict[str, float | None]]:
    """``model -> {key: geometric mean over rounds of model[key] / baseline[key]}`` for each other model."""
    return {
        model: {key: estimate.point for key, estimate in per_key.items()}
        for model, per_key in ratio_estimates(per_round_metrics, baseline, keys).items()
    }


def comparison_entry(estimates: dict[str, RatioEstimate], counts: BlockCounts | None) -> dict:
    """One variant's ``comparison`` entry: :func:`speedup_summary`, ratios, their 95 % intervals, verdict.

    ``verdict`` is None when the speed-up reads as a result, else why not (see
    :func:`loadtest.intervals.speedup_verdict`).
    """
    speedup = estimates["output_throughput"]
    entry = speedup_summary(speedup.point, counts)
    fraction = speedup.scaled(counts.ideal_speedup) if counts is not None else None
    entry["output_throughput_speedup_ci95"] = speedup.ci95
    entry["fraction_of_ideal_speedup_ci95"] = fraction.ci95 if fraction is not None else None
    entry["speedup_precision"] = speedup.precision
    entry["verdict"] = speedup_verdict(speedup, fraction)
    entry["ratios"] = {key: estimate.point for key, estimate in estimates.items()}
    entry["ratios_ci95"] = {key: estimate.ci95 for key, estimate in estimates.items()}
    return entry


def aa_entry(estimates: dict[str, RatioEstimate]) -> dict:
    """The A/A control's result: ``<key>_ratio`` and ``<key>_ratio_ci95`` for :data:`AA_KEYS`.

    The baseline measured again as its own arm: its ratios to the baseline would be 1 without noise, so
    their intervals are the run's noise floor; ``precision`` is the throughput interval's relative
    half-width.
    """
    aa: dict = {}
    for key in AA_KEYS:
        aa[f"{key}_ratio"] = estimates[key].point
        aa[f"{key}_ratio_ci95"] = estimates[key].ci95
    aa["precision"] = estimates["output_throughput"].precision
    aa["holds_1"] = estimates["output_throughput"].holds(1.0)
    return aa


def speedup_summary(throughput_ratio: float | None, counts: BlockCounts | None) -> dict:
    """Ideal speedup and the fractions of it that a measured output-throughput ratio reaches."""
    if counts is None:
        return {
            "num_blocks": None,
            "removed_blocks": None,
            "ideal_speedup": None,
            "output_throughput_speedup": throughput_ratio,
            "fraction_of_ideal_speedup": None,
            "fraction_of_ideal_gain": None,
        }
    ideal = counts.ideal_speedup
    fraction = throughput_ratio / ideal if throughput_ratio is not None else None
    gain = None
    if throughput_ratio is not None and ideal > 1:
        gain = (throughput_ratio - 1) / (ideal - 1)
    return {
        "num_blocks": counts.num_blocks,
        "removed_blocks": counts.removed,
        "blocks_source": counts.source,
        "ideal_speedup": ideal,
        "output_throughput_speedup": throughput_ratio,
        "fraction_of_ideal_speedup": fraction,
        "fraction_of_ideal_gain": gain,
    }


SPEC_DECODE_COUNTERS = {
    # our key: (the gateway's family, labelled by variant; vLLM's own family, labelled by model_name)
    "drafts": ("depthprune_gateway_spec_decode_num_drafts", "vllm:spec_decode_num_drafts"),
    "draft_tokens": ("depthprune_gateway_spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens"),
    "accepted_tokens": (
        "depthprune_gateway_spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens",
    ),
}
"""Speculative decoding's counters, as the gateway re-exports them per served name (``serve
--speculative``) and as vLLM names them (``vllm/v1/spec_decode/metrics.py``), for a bare vLLM target."""


def spec_decode_snapshot(targets: dict[str, str], api_key: str | None = None) -> dict[str, dict[str, float]]:
    """``model -> {drafts, draft_tokens, accepted_tokens}`` read from each target's ``/metrics`` now.

    Models without speculative decoding (or targets without ``/metrics``) are left out.
    """
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    texts: dict[str, str] = {}
    snapshot: dict[str, dict[str, float]] = {}
    for model, target in targets.items():
        if target not in texts:
            try:
                response = httpx.get(target.rstrip("/") + "/metrics", headers=headers, timeout=10)
                texts[target] = response.text if response.status_code == 200 else ""
            except httpx.HTTPError:
                texts[target] = ""
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(texts[target]):
            for key, names in SPEC_DECODE_COUNTERS.items():
                if family.name not in names:
                    continue
                for sample in family.samples:
                    labels = sample.labels
                    if sample.name.endswith("_total") and model in (
                        labels.get("variant"),
                        labels.get("model_name"),
                    ):
                        counts[key] = counts.get(key, 0.0) + sample.value
        if counts:
            snapshot[model] = counts
    return snapshot


def acceptance_entry(before: dict[str, float], after: dict[str, float]) -> dict:
    """Acceptance of one speculative arm over a run, from its counters before and after.

    ``acceptance_rate`` = accepted / drafted tokens (vLLM's reading); ``mean_accepted_length`` = 1 + accepted
    / drafts, the tokens each verification step emits (vLLM's "mean acceptance length", the bonus token
    included); ``k`` = drafted tokens per step; ``alpha_token`` the per-token α of Leviathan et al. whose
    expected accepted length is the measured one (:func:`loadtest.acceptance.token_alpha`: not the rate).
    """
    from loadtest.acceptance import token_alpha

    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in SPEC_DECODE_COUNTERS}
    k = round(delta["draft_tokens"] / delta["drafts"]) if delta["drafts"] > 0 else None
    length = 1 + delta["accepted_tokens"] / delta["drafts"] if delta["drafts"] > 0 else None
    return {
        **{key: int(value) for key, value in delta.items()},
        "k": k,
        "alpha_token": token_alpha(length, k) if length is not None and k else None,
        "acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"]
        if delta["draft_tokens"] > 0
        else None,
        "mean_accepted_length": 1 + delta["accepted_tokens"] / delta["drafts"]
        if delta["drafts"] > 0
        else None,
    }


def attach_acceptance(result: dict, before: dict[str, dict], after: dict[str, dict]) -> None:
    """Put each speculative arm's acceptance in ``result["speculative"]`` and beside its speed-up in
    ``result["comparison"]`` (``acceptance_rate``, ``mean_accepted_length``)."""
    arms = {model: acceptance_entry(before.get(model, {}), counts) for model, counts in after.items()}
    if not arms:
        return
    result["speculative"] = arms
    for model, entry in arms.items():
        comparison = result.get("comparison", {}).get(model)
        if comparison is not None:
            comparison["acceptance_rate"] = entry["acceptance_rate"]
            comparison["mean_accepted_length"] = entry["mean_accepted_length"]
