"""Prometheus metrics of the gateway, labelled per variant and per experiment arm.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` ...) under the ``depthprune_gateway_`` prefix,
with vLLM's histogram buckets plus a few finer low buckets (tiny CPU models answer in milliseconds), so
dashboards built for vLLM read them the same way. Each app has its own ``CollectorRegistry`` so
several gateways (tests) can live in one process. The backends' own vLLM metrics are proxied at
``/metrics/backends/{variant}`` (``?replica=I`` for one replica of several).

A speculative arm (``serve --speculative``) also gets vLLM's acceptance counters, read from its engines at
each scrape of ``/metrics`` and re-exported labelled by served name (``depthprune_gateway_spec_decode_*``).

A variant served by several engines (``serve --replicas``) keeps the per-variant families as they were
(``backend_up`` is 1 while any replica answers, ``backend_restarts`` counts the restarts of all of them), so
dashboards and alerts on them stay true; the ``replica_*`` families add a ``replica`` label (0, 1, ...) for
each engine's state and share of the traffic.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from server.sequential import Moments

# vLLM's buckets (vllm/v1/metrics/loggers.py), with finer ones below its smallest.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
E2E_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# vLLM's time-per-output-token buckets, with finer ones below its smallest.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
WIRE_PUNCTUATION = "!#$&'()*+,-./:;<=>?@[]^_`{|}~"
WIRE_SAFE = re.compile(r"[A-Za-z0-9" + re.escape(WIRE_PUNCTUATION) + r"]*")
"""Visible ASCII but ``%``, ``"`` and ``\\``: carried by a header value and a label value as it is, and never
mistaken for a percent-encoded value."""
REQUEST_LABELS = ("variant", "experiment", "arm")
ARM_LABELS = ("experiment", "arm")
REPLICA_LABELS = ("variant", "replica")
FALLBACK_LABELS = ("experiment", "arm", "variant")

FAMILIES = {
    # attribute: (kind, name after the prefix, help, labels, histogram buckets)
    "requests": (
        Counter,
        "requests",
        "Requests answered, by variant, arm, endpoint and status.",
        (*REQUEST_LABELS, "endpoint", "status"),
        None,
    ),
    "ttft": (
        Histogram,
        "time_to_first_token_seconds",
        "Time from request arrival to the first streamed token (streaming requests).",
        REQUEST_LABELS,
        TTFT_BUCKETS,
    ),
    "e2e": (
        Histogram,
        "e2e_request_latency_seconds",
        "Time from request arrival to the last byte of the response.",
        REQUEST_LABELS,
        E2E_BUCKETS,
    ),
    "tpot": (
        Histogram,
        "time_per_output_token_seconds",
        "Time per output token after the first (streaming requests of more than one token).",
        REQUEST_LABELS,
        TPOT_BUCKETS,
    ),
    "prompt_tokens": (Counter, "prompt_tokens", "Prompt tokens of answered requests.", REQUEST_LABELS, None),
    "generation_tokens": (
        Counter,
        "generation_tokens",
        "Generated tokens of answered requests.",
        REQUEST_LABELS,
        None,
    ),
    "in_flight": (Gauge, "requests_in_flight", "Requests being proxied now.", ("variant",), None),
    "backend_up": (
        Gauge,
        "backend_up",
        "1 when the variant's backend (any of its replicas) answers /health.",
        ("variant",),
        None,
    ),
    "backend_restarts": (Counter, "backend_restarts", "Restarts of managed backends.", ("variant",), None),
    "replica_up": (
        Gauge,
        "replica_up",
        "1 when this replica (engine) of the variant answers /health.",
        REPLICA_LABELS,
        None,
    ),
    "replica_in_flight": (
        Gauge,
        "replica_requests_in_flight",
        "Requests being proxied now, per replica of the variant.",
        REPLICA_LABELS,
        None,
    ),
    "replica_requests": (
        Counter,
        "replica_requests",
        "Requests sent to each replica of the variant (the balance of the replica choice).",
        REPLICA_LABELS,
        None,
    ),
    "upstream_retries": (
        Counter,
        "upstream_retries",
        "Requests sent again on a new connection after a kept-alive one failed before any answer.",
        ("variant",),
        None,
    ),
    "fallbacks": (
        Counter,
        "fallbacks",
        "Requests served by a fallback because their arm was down.",
        FALLBACK_LABELS,
        None,
    ),
    "shadow_scored": (
        Counter,
        "shadow_scored",
        "Completions of an arm scored afterwards by the experiment's control model.",
        ARM_LABELS,
        None,
    ),
    "shadow_dropped": (
        Counter,
        "shadow_dropped",
        "Completions sampled for shadow scoring but not scored, by reason (queue_full, control_down, "
        "control_busy, too_long, failed, experiment_gone).",
        (*ARM_LABELS, "reason"),
        None,
    ),
}
"""Every family of :class:`GatewayMetrics`, by the attribute that holds it."""
PREFIX = "depthprune_gateway_"


def wire_value(text: str) -> str:
    """``text`` as a response header value or metric label value: as it is when :data:`WIRE_SAFE` (every name
    the spec checks allow), else percent-encoded UTF-8, so that no name (one written to the database behind
    the API's back, or installed by code that skipped the checks) can break a response, inject a header or
    a line of the exposition format.
    """
    return text if WIRE_SAFE.fullmatch(text) else quote(text, safe=WIRE_PUNCTUATION)


SPEC_DECODE_FAMILIES = {
    # vLLM 0.32's counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): ours, under the prefix.
    "vllm:spec_decode_num_drafts": (
        "spec_decode_num_drafts",
        "Speculative steps (drafts) of the arm's engines.",
    ),
    "vllm:spec_decode_num_draft_tokens": (
        "spec_decode_num_draft_tokens",
        "Tokens the draft model proposed for the arm (K per draft).",
    ),
    "vllm:spec_decode_num_accepted_tokens": (
        "spec_decode_num_accepted_tokens",
        "Drafted tokens the dense model accepted: acceptance rate = accepted / draft tokens, mean accepted "
        "length = 1 + accepted / drafts.",
    ),
}
"""vLLM's speculative-decoding counters re-exported per speculative arm: vLLM name -> (our name, help)."""
SPEC_DECODE_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_decode_counts(exposition: str) -> dict[str, float]:
    """Totals of vLLM's speculative-decoding counters in one ``/metrics`` text (summed over engines).

    Returns:
        ``{vLLM family name: total}`` for :data:`SPEC_DECODE_FAMILIES`, and ``"<per pos family>:<position>"``
        for the accepted tokens per draft position; empty for an engine without speculative decoding.
    """
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name not in SPEC_DECODE_FAMILIES and family.name != SPEC_DECODE_PER_POSITION:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            key = family.name
            if family.name == SPEC_DECODE_PER_POSITION:
                key = f"{family.name}:{sample.labels.get('position', '')}"
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


class SpecDecodeCollector:
    """The speculative arms' acceptance counters, as last read from their engines (at each scrape)."""

    def __init__(self):
        self.counts: dict[str, dict[str, float]] = {}
        """``served name -> spec_decode_counts()`` summed over the arm's replicas."""

    def collect(self):
        """Prometheus collector protocol: one counter family per vLLM counter, labelled by variant."""
        for vllm_name, (name, documentation) in SPEC_DECODE_FAMILIES.items():
            family = CounterMetricFamily(PREFIX + name, documentation, labels=["variant"])
            for variant, counts in sorted(self.counts.items()):
                family.add_metric([wire_value(variant)], counts.get(vllm_name, 0.0))
            yield family
        family = CounterMetricFamily(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Drafted tokens accepted at each draft position (0 = first drafted token).",
            labels=["variant", "position"],
        )
        prefix = SPEC_DECODE_PER_POSITION + ":"
        for variant, counts in sorted(self.counts.items()):
            for key, value in sorted(counts.items()):
                if key.startswith(prefix):
                    family.add_metric([wire_value(variant), key[len(prefix) :]], value)
        yield family


MOMENTS_FAMILY = "arm_moments"
"""``depthprune_gateway_arm_moments_total{experiment, arm, measure, moment}``: count, sum and sum of squares
of each arm's per-request measures, the sufficient statistics a report adds up over replicas."""


class ArmMomentsCollector:
    """Exports :attr:`GatewayMetrics.arm_moments` at each scrape (one consistent snapshot per arm)."""

    def __init__(self, moments: dict[tuple[str, str], dict[str, Moments]]):
        self.moments = moments

    def collect(self):
        family = CounterMetricFamily(
            PREFIX + MOMENTS_FAMILY,
            "Per experiment arm and measure (dense_nll, top1_agreement: shadow-scored completions; tpot, "
            "e2el: answered requests, seconds): count, sum and sum of squares.",
            labels=("experiment", "arm", "measure", "moment"),
        )
        for (experiment, arm), measures in list(self.moments.items()):
            for measure, value in measures.items():
                numbers = {"count": value.count, "sum": value.total, "sum_squares": value.squares}
                for moment, number in numbers.items():
                    family.add_metric([experiment, arm, measure, moment], number)
        yield family


class GatewayMetrics:
    """The gateway's metric families in their own registry (one attribute per entry of :data:`FAMILIES`)."""

    requests: Counter
    ttft: Histogram
    e2e: Histogram
    tpot: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    in_flight: Gauge
    backend_up: Gauge
    backend_restarts: Counter
    replica_up: Gauge
    replica_in_flight: Gauge
    replica_requests: Counter
    upstream_retries: Counter
    fallbacks: Counter
    shadow_scored: Counter
    shadow_dropped: Counter

    def __init__(self):
        self.registry = CollectorRegistry()
        for attribute, (kind, name, documentation, labels, buckets) in FAMILIES.items():
            extra = {"buckets": buckets} if buckets is not None else {}
            family = kind(PREFIX + name, documentation, labels, registry=self.registry, **extra)
            setattr(self, attribute, family)
        self.spec_decode = SpecDecodeCollector()
        self.registry.register(self.spec_decode)
        self.arm_moments: dict[tuple[str, str], dict[str, Moments]] = {}
        """This gateway's statistics per (experiment, arm) and measure (``tpot``, ``e2el``, ``dense_nll``,
        ``top1_agreement``): what its guardrails and page read, and what ``/metrics`` exports."""
        self.registry.register(ArmMomentsCollector(self.arm_moments))

    def observe_latency(
        self, labels: tuple[str, str, str], measure: str, seconds: float, answered: bool
    ) -> None:
        """One request's ``tpot`` or ``e2el``: its histogram and, for an answered request (2xx) of an
        experiment, the arm's moments (an error's latency says nothing of the arm's speed)."""
        (self.tpot if measure == "tpot" else self.e2e).labels(*labels).observe(seconds)
        if answered and labels[1]:
            self._moment(labels[1], labels[2], measure, seconds)

    def observe_shadow(self, experiment: str, arm: str, dense_nll: float, top1_agreement: float) -> None:
        """One shadow-scored completion of ``arm``."""
        labels = (wire_value(experiment), wire_value(arm))
        self.shadow_scored.labels(*labels).inc()
        self._moment(*labels, "dense_nll", dense_nll)
        self._moment(*labels, "top1_agreement", top1_agreement)

    def _moment(self, experiment: str, arm: str, measure: str, value: float) -> None:
        measures = self.arm_moments.setdefault((experiment, arm), {})
        measures[measure] = measures.get(measure, Moments()).add(value)

    def moments(self, experiment: str) -> dict[str, dict[str, Moments]]:
        """``{arm: {measure: Moments}}`` of this gateway for ``experiment``."""
        key = wire_value(experiment)
        return {arm: dict(measures) for (name, arm), measures in self.arm_moments.items() if name == key}

    def forget(self, experiment: str, arms: set[str] | None = None) -> None:
        """Remove the series of an experiment's ``arms`` (of the whole experiment when None): a deleted
        experiment or arm leaves no series behind, so the label sets stay as few as the experiments served.
        """
        selectors = [{"experiment": wire_value(experiment)}] if arms is None else []
        selectors += [
            {"experiment": wire_value(experiment), "arm": wire_value(arm)} for arm in sorted(arms or ())
        ]
        for attribute, (_, _, _, labels, _) in FAMILIES.items():
            if "experiment" in labels:
                for selector in selectors:
                    getattr(self, attribute).remove_by_labels(selector)
        gone = {wire_value(arm) for arm in arms} if arms is not None else None
        for key in [key for key in self.arm_moments if key[0] == wire_value(experiment)]:
            if gone is None or key[1] in gone:
                del self.arm_moments[key]

    def render(self) -> bytes:
        """The text exposition format of every family."""
        return generate_latest(self.registry)
