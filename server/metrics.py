"""Prometheus metrics of the gateway, labelled per variant and per experiment arm.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` ...) under the ``depthprune_gateway_`` prefix,
with vLLM's histogram buckets plus a few finer low buckets (tiny CPU models answer in milliseconds), so
dashboards built for vLLM read them the same way. Each app has its own ``CollectorRegistry`` so
several gateways (tests) can live in one process. The backends' own vLLM metrics are proxied at
``/metrics/backends/{variant}`` (``?replica=I`` for one replica of several).

A variant served by several engines (``serve --replicas``) keeps the per-variant families as they were
(``backend_up`` is 1 while any replica answers, ``backend_restarts`` counts the restarts of all of them), so
dashboards and alerts on them stay true; the ``replica_*`` families add a ``replica`` label (0, 1, ...) for
each engine's state and share of the traffic.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
REQUEST_LABELS = ("variant", "experiment", "arm")


class GatewayMetrics:
    """The gateway's metric families in their own registry."""

    def __init__(self):
        self.registry = CollectorRegistry()
        prefix = "depthprune_gateway_"
        self.requests = Counter(
            prefix + "requests",
            "Requests answered, by variant, arm, endpoint and status.",
            [*REQUEST_LABELS, "endpoint", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            prefix + "time_to_first_token_seconds",
            "Time from request arrival to the first streamed token (streaming requests).",
            REQUEST_LABELS,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            prefix + "e2e_request_latency_seconds",
            "Time from request arrival to the last byte of the response.",
            REQUEST_LABELS,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            prefix + "time_per_output_token_seconds",
            "Time per output token after the first (streaming requests of more than one token).",
            REQUEST_LABELS,
            buckets=TPOT_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            prefix + "prompt_tokens",
            "Prompt tokens of answered requests.",
            REQUEST_LABELS,
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            prefix + "generation_tokens",
            "Generated tokens of answered requests.",
            REQUEST_LABELS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            prefix + "requests_in_flight", "Requests being proxied now.", ["variant"], registry=self.registry
        )
        self.backend_up = Gauge(
            prefix + "backend_up",
            "1 when the variant's backend (any of its replicas) answers /health.",
            ["variant"],
            registry=self.registry,
        )
        self.backend_restarts = Counter(
            prefix + "backend_restarts", "Restarts of managed backends.", ["variant"], registry=self.registry
        )
        self.replica_up = Gauge(
            prefix + "replica_up",
            "1 when this replica (engine) of the variant answers /health.",
            ["variant", "replica"],
            registry=self.registry,
        )
        self.replica_in_flight = Gauge(
            prefix + "replica_requests_in_flight",
            "Requests being proxied now, per replica of the variant.",
            ["variant", "replica"],
            registry=self.registry,
        )
        self.replica_requests = Counter(
            prefix + "replica_requests",
            "Requests sent to each replica of the variant (the balance of the replica choice).",
            ["variant", "replica"],
            registry=self.registry,
        )
        self.upstream_retries = Counter(
            prefix + "upstream_retries",
            "Requests sent again on a new connection after a kept-alive one failed before any answer.",
            ["variant"],
            registry=self.registry,
        )
        self.fallbacks = Counter(
            prefix + "fallbacks",
            "Requests served by a fallback because their arm was down.",
            ["experiment", "arm", "variant"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The text exposition format of every family."""
        return generate_latest(self.registry)
