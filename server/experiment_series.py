"""Each experiment's per-arm figures at regular instants: what the experiment page (``/ui/``) draws over time.

Every ``series_interval_s`` (10 s by default) the gateway's :class:`SeriesSampler` takes the counters of its
own ``/metrics`` that it needs (requests, shadow scored and dropped, and the arms' moments, rendered
in-process) and those of its ``peers`` (the other gateway replicas' ``/metrics``, read over HTTP), adds them
up per arm with :func:`server.experiment_report.arm_traffic` (the function that adds
gateways for ``experiments report``), compares every arm with the control with
:func:`server.experiment_comparison.compare_arms`, and keeps:

* the latest figures of every experiment (requests, shadow-scored and dropped counts, each arm's own quality
  and its comparisons with their confidence sequences and verdicts), which the page shows as numbers;
* a :class:`Series` per experiment: per arm the three counts and ``nll_delta``, ``agreement_delta``,
  ``tpot_ratio``, ``e2el_ratio`` with their sequence bounds (:data:`FIELDS`), which the page draws as lines
  with bands.

Why the replicas' ``/metrics`` and not the registry: the registry holds specs and their history, not traffic.
The arms' sufficient statistics (count, sum, sum of squares per measure) are already exported by every
replica as counters that add up exactly, which is what the report does; reading them keeps the page and
``experiments report --gateway ... --gateway ...`` in agreement by construction, and puts no write load on the
database that every replica polls for routing. The cost is that a gateway must be told its peers, and a
restarted replica's counters start again from zero (as in the report).

Memory is bounded: a series holds at most ``series_points`` points (720 by default). When it is full, every
other point is dropped and from then on only every second sample is kept (the stride doubles), so a series
always spans the experiment's whole life on this gateway at a resolution that halves each time it fills. A
point is ``len(FIELDS)`` float32 numbers per arm plus its number, time and the arms' names (shared between
points): about 190 bytes plus 60 per arm (measured with ``tracemalloc`` in ``tests/test_experiment_page.py``),
so 720 points of a 4-arm experiment take about 320 KB, and the most the registry's limits allow (64
experiments of 16 arms) about 53 MB.

Nothing here is on the request path: the sampler runs on a timer, parses in a worker thread, and its reads of
the metrics are the ones a Prometheus scrape makes.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from server.experiment_comparison import compare_arms
from server.experiment_report import ArmTraffic, arm_traffic
from server.experiments import Experiment
from server.metrics import MOMENTS_FAMILY, PREFIX, ArmMomentsCollector, GatewayMetrics, wire_value

log = logging.getLogger("depthprune.server")

CHARTED = ("nll_delta", "agreement_delta", "tpot_ratio", "e2el_ratio")
"""The comparisons with the control drawn over time, one chart each."""
COUNTS = ("requests", "shadow_scored", "shadow_dropped")
FIELDS = (*COUNTS, *(f"{measure}{part}" for measure in CHARTED for part in ("", "_low", "_high")))
"""The numbers a point holds per arm, in order (NaN where a figure is not defined yet)."""
PEER_TIMEOUT_S = 5.0
"""Longest a peer's ``/metrics`` may take before this sample goes without it."""
FAMILIES = tuple(PREFIX + name for name in ("requests", "shadow_scored", "shadow_dropped", MOMENTS_FAMILY))
"""The counter families a sample reads (not the latency histograms: the arms' moments hold their means)."""
SAMPLE_PREFIXES = tuple(f"{family}_total{{" for family in FAMILIES)


@dataclass(frozen=True, slots=True)
class Point:
    """A sample of an experiment: arm ``arms[i]`` has its :data:`FIELDS` from ``values[i * len(FIELDS)]``."""

    seq: int
    """Increasing number of the point within its series (kept when older points are dropped)."""
    time: float
    """When it was sampled (Unix seconds)."""
    arms: tuple[str, ...]
    values: array

    def arm_values(self) -> dict[str, list[float | None]]:
        """``{arm: [field values]}`` with NaN as None, rounded to 6 significant digits (for JSON)."""
        width = len(FIELDS)
        return {
            arm: [_shown(value) for value in self.values[index * width : (index + 1) * width]]
            for index, arm in enumerate(self.arms)
        }

    def json(self) -> dict[str, Any]:
        return {"seq": self.seq, "t": round(self.time, 3), "arms": self.arm_values()}


def _shown(value: float) -> float | None:
    return None if math.isnan(value) else float(f"{value:.6g}")


class Series:
    """One experiment's points, at most ``max_points``; when full, every other point goes and the stride
    (samples per kept point) doubles, so the series spans the whole run at a resolution that halves."""

    def __init__(self, max_points: int):
        self.max_points = max_points
        self.started = time.time()
        """When the series began (a page that sees it change starts its copy over)."""
        self.points: list[Point] = []
        self.stride = 1
        self._offered = 0
        self._next_seq = 0
        self._arm_names: tuple[str, ...] = ()

    def offer(self, moment: float, arms: dict[str, dict[str, Any]]) -> Point | None:
        """A new sample ``{arm: figures}``; kept when it falls on the stride. Returns the kept point."""
        offered, self._offered = self._offered, self._offered + 1
        if offered % self.stride:
            return None
        if len(self.points) >= self.max_points:
            self.points = self.points[::2]
            self.stride *= 2
        names = tuple(arms)
        if names != self._arm_names:
            self._arm_names = names  # one tuple shared by every point while the arms stay the same
        values = array("f", [_number(arms[name].get(key)) for name in names for key in FIELDS])
        point = Point(self._next_seq, moment, self._arm_names, values)
        self._next_seq += 1
        self.points.append(point)
        return point

    def after(self, seq: int) -> list[Point]:
        """The points kept whose ``seq`` is above ``seq`` (-1: all)."""
        start = bisect.bisect_right([point.seq for point in self.points], seq)
        return self.points[start:]


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def figures_of(experiment: Experiment, texts: list[str]) -> dict[str, dict[str, Any]]:
    """Per arm of ``experiment`` (by its name, in spec order) what the gateways' ``/metrics`` texts add up
    to: the counts, its own shadow quality and, but for the control, its comparisons with the control
    (``vs_control``, flattened into the row for :data:`FIELDS`)."""
    names = [arm.name for arm in experiment.arms]
    wire = {name: wire_value(name) for name in names}  # the labels the metrics carry
    traffic = arm_traffic(texts, wire_value(experiment.name))
    moments = {label: arm.moments for label, arm in traffic.items()}
    compared = compare_arms(moments, list(wire.values()), wire[experiment.control], experiment.spec.margin)
    rows = {}
    for name in names:
        arm = traffic.get(wire[name], ArmTraffic())
        row = {
            "requests": arm.requests,
            "errors": arm.errors,
            "shadow_scored": arm.shadow_scored,
            "shadow_dropped": arm.shadow_dropped,
            **compared[wire[name]],
        }
        row.update({key: value for key, value in row.get("vs_control", {}).items() if key in CHARTED})
        for measure in CHARTED:
            bounds = row.get("vs_control", {}).get(f"{measure}_cs95")
            row[f"{measure}_low"], row[f"{measure}_high"] = bounds if bounds else (None, None)
        rows[name] = row
    return rows


def split_by_experiment(text: str) -> dict[str, list[str]]:
    """The sample lines of :data:`FAMILIES` in a ``/metrics`` text, by the value of their ``experiment``
    label: one pass, so that each experiment parses only its own few lines (the parser needs no ``# TYPE``
    line for counters)."""
    samples: dict[str, list[str]] = {}
    marker = 'experiment="'
    for line in text.splitlines():
        if not line.startswith(SAMPLE_PREFIXES):
            continue
        start = line.find(marker)
        if start < 0:
            continue
        start += len(marker)
        samples.setdefault(line[start : line.find('"', start)], []).append(line)
    return samples


def sample_all(experiments: dict[str, Experiment], texts: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`figures_of` for every experiment, each parsing only its own lines of ``texts``."""
    parts = [split_by_experiment(text) for text in texts]
    figures = {}
    for name, experiment in experiments.items():
        label = wire_value(name)
        own = ["\n".join([*samples.get(label, []), ""]) for samples in parts]
        figures[name] = figures_of(experiment, own)
    return figures


class _SampledFamilies:
    """This gateway's :data:`FAMILIES` as a collector: what a scrape of them would read, without rendering
    the latency histograms (most of ``/metrics``)."""

    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics

    def collect(self):
        for family in (self.metrics.requests, self.metrics.shadow_scored, self.metrics.shadow_dropped):
            yield from family.collect()
        yield from ArmMomentsCollector(self.metrics.arm_moments).collect()


def own_metrics_text(metrics: GatewayMetrics) -> str:
    """This gateway's :data:`FAMILIES` in the exposition format (in the event loop: the collectors read live
    dicts)."""
    from prometheus_client import generate_latest

    return generate_latest(_SampledFamilies(metrics)).decode()


@dataclass
class Latest:
    """The newest sample of one experiment, with everything the page shows as numbers."""

    time: float
    arms: dict[str, dict[str, Any]]
    peers: dict[str, str | None] = field(default_factory=dict)
    """Each peer and why its figures are missing from this sample (None: they are in)."""


class SeriesSampler:
    """Samples every experiment of this gateway (and its peers) every ``interval_s`` into bounded series."""

    def __init__(
        self,
        router,
        metrics: GatewayMetrics,
        *,
        interval_s: float = 10.0,
        max_points: int = 720,
        peers: list[str] | None = None,
        api_key: str | None = None,
    ):
        """
        Args:
            router: the gateway's :class:`server.experiments.Router` (the experiments it routes).
            metrics: the gateway's metrics (rendered as a scrape of ``/metrics`` would be).
            interval_s: seconds between two samples.
            max_points: most points a series keeps (see the module's note on memory).
            peers: base URLs of the other replicas whose ``/metrics`` are added to this one's.
            api_key: sent to the peers (replicas share their key; needed where they set ``metrics_auth``).
        """
        self.router, self.metrics = router, metrics
        self.interval_s, self.max_points = interval_s, max_points
        self.peers = [peer.rstrip("/") for peer in peers or []]
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.series: dict[str, Series] = {}
        self.latest: dict[str, Latest] = {}
        self.samples = 0
        """Samples taken since start."""
        self._task: asyncio.Task | None = None
        self._client = None

    def start(self) -> None:
        """Sample now and then every ``interval_s`` (needs the running loop)."""
        import httpx

        self._client = httpx.AsyncClient(timeout=min(PEER_TIMEOUT_S, self.interval_s))
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except Exception:  # a bug must not end the sampling for the life of the gateway
                log.exception("sampling the experiments for the page failed")
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def sample(self) -> None:
        """One sample of every experiment this gateway routes."""
        experiments = dict(self.router.experiments)
        texts = [own_metrics_text(self.metrics)]
        peers = await self._read_peers(texts)
        moment = time.time()
        figures = await asyncio.to_thread(sample_all, experiments, texts)
        for name in set(self.series) - set(experiments):  # deleted: its series goes with it
            del self.series[name]
            self.latest.pop(name, None)
        for name, arms in figures.items():
            self.series.setdefault(name, Series(self.max_points)).offer(moment, arms)
            self.latest[name] = Latest(moment, arms, peers)
        self.samples += 1

    async def _read_peers(self, texts: list[str]) -> dict[str, str | None]:
        """Append each peer's ``/metrics`` to ``texts``; per peer, why it is missing (None when read)."""
        import httpx

        async def read(peer: str) -> tuple[str | None, str | None]:
            try:
                response = await self._client.get(f"{peer}/metrics", headers=self._headers)
            except httpx.HTTPError as error:
                return None, f"{type(error).__name__}: {error}"[:200]
            if response.status_code != 200:
                return None, f"answered {response.status_code}"
            return response.text, None

        results = await asyncio.gather(*(read(peer) for peer in self.peers))
        texts.extend(text for text, _ in results if text is not None)
        return {peer: error for peer, (_, error) in zip(self.peers, results)}
