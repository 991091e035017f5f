"""Does the online signal agree with the offline yardstick? (issue 53 item 6)

On a home where ``depthprune demo`` left its SmolLM2-135M variants (M = 8 of 30: ``ppl-best``, ``ce-best`` and
the patched ``ppl-best``), ``depthprune serve`` runs one vLLM CPU engine per model (dense, ppl-best, ce-best,
the patched child: four engines, float32, eager, 1 GiB of KV cache each) and the gateway holds one experiment
per prompt domain, every one with the arms ``dense`` (the control), ``dense-aa`` (dense again: the A/A arm),
``ppl-best``, ``ce-best`` and ``ppl-best+patch``, ``shadow_rate`` 1, and one more experiment with the same
arms and ``shadow_rate`` 0 (``online-off``):

* the prompts are held out: the start of prose paragraphs of pydoc's *test* split (topics no calibration,
  repair or validation step reads; in-domain for the perplexity objective) and of runs of GCIDE dictionary
  entries that neither offline GCIDE task uses (out of domain for every objective);
* answers are sampled (temperature 1, streamed, at most ``--max-tokens``), each request forced to its arm
  (``x-depthprune-arm``) so that every arm gets the same count, arms and domains interleaved;
* requests run in blocks of ``--block-requests`` per arm and domain, in ABBA order of the two phases (off, on,
  on, off, ...); after each shadow-on block the gateway's scoring queue is drained and each experiment's
  report (:func:`server.experiment_report.report`) is read: one *look* every ``--block-requests`` requests
  per arm. The off blocks give the phase comparison its baseline: the scoring's cost to each arm's TPOT is
  the on/off ratio over adjacent pairs, with same-phase pairs as its A/A control
  (:mod:`benchmarks.online_quality_reading`);
* the offline yardstick is what the demo recorded in the registry (``eval --suite offline``: pydoc and GCIDE
  perplexity, each variant paired against dense): the arms' online order (``nll_delta``) is compared with
  their offline order (perplexity retention).

Make the home first (about 10 minutes on 2 cores; it converts the embedded GGUF once)::

    DEPTHPRUNE_HOME=/work/online-quality-home nice .venv/bin/python -m depthprune demo --port 8791

then (``--run-demo`` runs that first when the home has no demo)::

    nice .venv/bin/python -m benchmarks.bench_online_quality --home /work/online-quality-home \\
        --out docs/online-quality/smollm2-135m.json

``--smoke`` runs the same protocol in seconds against fake vLLM backends (:mod:`depthprune.testing.fake_vllm`,
where another model's tokens cost 1 nat): what the test suite runs. ``--render FILE`` prints the tables of
docs/benchmarks.md from a record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.online_quality_reading import (
    abba_phases,
    first_decisions,
    markdown,
    order_comparison,
    phase_cost,
)

ROOT = Path(__file__).resolve().parent.parent
CONTROL, AA_ARM = "dense", "dense-aa"
VARIANT_ARMS = ("ppl-best", "ce-best", "ppl-best+patch")
"""The demo's variants as arms: its two aliases and its repaired child (``depthprune.cli.demo_repair``)."""
OFF_EXPERIMENT = "online-off"
HOME_PLACEHOLDER = "$DEPTHPRUNE_HOME"
"""What the record says instead of the demo home's path (tests/test_study_paths.py)."""
OFFLINE_TASKS = ("pydoc", "gcide")
"""The offline suite's perplexity tasks the online order is compared with."""
SERVE_OPTIONS = ("--dtype", "float32", "--max-model-len", "512", "--vllm-arg=--enforce-eager")
"""As the demo serves a real model (``depthprune.cli.demo.REAL_SERVE_ARGS``), float32 named."""


@dataclass
class OnlineQualityConfig:
    """What one run does."""

    home: Path | None = None
    """A finished ``depthprune demo`` home (DEPTHPRUNE_HOME) on smollm2-135m; not used by ``smoke``."""
    run_demo: bool = False
    """Run ``depthprune demo`` into ``home`` first when it has no demo variants."""
    out: Path | None = None
    """Where the JSON record goes (None: printed only)."""
    blocks: int = 10
    """Shadow-on blocks (and as many shadow-off ones, in ABBA order): one look per on block."""
    block_requests: int = 10
    """Requests per arm and prompt domain in a block (the looks' spacing)."""
    domains: tuple[str, ...] = ("pydoc", "gcide")
    """Held-out prompt domains, one shadow-on experiment each."""
    max_tokens: int = 32
    """Most tokens sampled per answer."""
    temperature: float = 1.0
    """Sampling temperature of the answers."""
    prompt_words: int = 40
    """Words per prompt (cut at a word boundary)."""
    concurrency: int = 4
    """Requests in flight per arm (each arm its own closed loop). Not one pool for all arms: there the
    control's slower requests pile up, and while the control's engine has 16 requests of the gateway
    outstanding (``GatewaySettings.shadow_max_control_in_flight``, which ``serve`` does not set) completions
    are dropped unscored (``control_busy``): in a first run, 60 % of the variants' and 20 % of dense's."""
    kv_cache_gib: int = 1
    """KV cache per vLLM engine, GiB."""
    seed: int = 0
    """Seed of the prompts' order."""
    time_budget_s: float | None = None
    """Seconds of requests after which no further ABBA group (off, on, on, off) starts: a group is not begun
    when the groups so far say it would end past the budget (None: all ``blocks``)."""
    variants: tuple[str, ...] = VARIANT_ARMS
    """The variant arms beside ``dense`` and ``dense-aa`` (fewer engines when memory is short)."""
    smoke: bool = False
    """Fake vLLM backends in threads, a few requests: the protocol end to end in seconds."""

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm, the control first."""
        return (CONTROL, AA_ARM, *self.variants)

    def __post_init__(self):
        unknown = [name for name in self.variants if name not in VARIANT_ARMS]
        if unknown:
            raise SystemExit(f"unknown variant arm {unknown[0]!r}; choose from {', '.join(VARIANT_ARMS)}")
        if self.smoke:
            return
        if self.home is None:
            raise SystemExit("--home DIR is required (a finished `depthprune demo` home; see --help)")
        for name in ("blocks", "block_requests", "max_tokens", "prompt_words", "concurrency", "kv_cache_gib"):
            if getattr(self, name) < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")


SMOKE = dict(blocks=2, block_requests=15, domains=("pydoc",), max_tokens=4, prompt_words=12, concurrency=2)
"""``--smoke``'s sizes (the fake backends answer in milliseconds)."""


# ------------------------------------------------------------------------------ held-out prompts


def _first_words(text: str, count: int) -> str:
    """``text`` up to the end of its ``count``-th word (line breaks kept)."""
    ends = [match.end() for match in re.finditer(r"\S+", text)]
    return text[: ends[min(count, len(ends)) - 1]] if ends else ""


def pydoc_prompts(words: int) -> list[str]:
    """Starts of the prose paragraphs of pydoc's test split (:mod:`pruning.calibration.data.pydoc`)."""
    from pruning.calibration.data.pydoc import is_prose, pydoc_documents

    paragraphs = [p for document in pydoc_documents("test") for p in re.split(r"\n\s*\n", document.text)]
    return [_first_words(paragraph.strip(), words) for paragraph in paragraphs if is_prose(paragraph)]


def gcide_prompts(words: int, count: int, seed: int) -> list[str]:
    """Runs of consecutive GCIDE entries (as the ``gcide`` task writes them) from headwords neither offline
    GCIDE task reads (hash fraction at or above :data:`pruning.evaluation.gcide.PROSE_FRACTION`)."""
    from pruning.evaluation.gcide import PROSE_FRACTION, entry_text, hash_fraction, load_entries

    entries = load_entries()
    unused = sorted(word for word in entries if hash_fraction(word) >= PROSE_FRACTION)
    texts = [text for word in unused if (text := entry_text(word, entries[word])) != word]
    rng = random.Random(f"gcide-prompts:{seed}")
    prompts = []
    for start in rng.sample(range(len(texts) - 8), count):
        prompts.append(_first_words("\n".join(texts[start : start + 8]), words))
    return prompts


def held_out_prompts(domain: str, count: int, words: int, seed: int) -> list[str]:
    """``count`` prompts of ``domain`` in a seeded order (cycled when the domain has fewer)."""
    if domain == "gcide":
        prompts = gcide_prompts(words, count, seed)
    elif domain == "pydoc":
        prompts = pydoc_prompts(words)
    else:
        raise SystemExit(f"unknown prompt domain {domain!r}; use pydoc or gcide")
    random.Random(f"{domain}:{seed}").shuffle(prompts)
    return [prompts[index % len(prompts)] for index in range(count)]


# ------------------------------------------------------------------------------ the demo's variants


def demo_variants(registry) -> dict[str, Any]:
    """Arm -> the registry's variant (dense, the two aliases, ppl-best's newest patched child).

    Raises:
        LookupError: the home holds no finished demo.
    """
    found = {CONTROL: registry.resolve("dense"), AA_ARM: registry.resolve("dense")}
    for alias in ("ppl-best", "ce-best"):
        found[alias] = registry.resolve(alias)
    children = [child for child in registry.healed_from(found["ppl-best"].name) if child.healing]
    patched = [child for child in children if child.healing.get("method") == "patch"]
    if not patched:
        raise LookupError("ppl-best has no patched child (the demo's repair step did not run)")
    found["ppl-best+patch"] = patched[-1]
    return found


def open_demo(config: OnlineQualityConfig):
    """The home's registry and its arms' variants, running ``depthprune demo`` first when asked."""
    from ground.core.errors import UserError
    from registry import open_registry

    url = f"sqlite:///{config.home.resolve() / 'registry.db'}"
    try:
        registry = open_registry(url)
        return url, registry, demo_variants(registry)
    except (UserError, LookupError) as missing:
        if not config.run_demo:
            raise SystemExit(
                f"{config.home} holds no finished demo ({missing}). Make one (about 10 minutes):\n"
                f"  DEPTHPRUNE_HOME={config.home} nice .venv/bin/python -m depthprune demo --port 8791\n"
                "or pass --run-demo."
            ) from None
    env = {**os.environ, "DEPTHPRUNE_HOME": str(config.home)}
    command = [sys.executable, "-m", "depthprune", "demo", "--port", "8791"]
    subprocess.run(command, env=env, check=True, cwd=ROOT)
    registry = open_registry(url)
    return url, registry, demo_variants(registry)


# ------------------------------------------------------------------------------ the gateway


def experiments(served: dict[str, str], domains: tuple[str, ...]) -> dict[str, dict]:
    """One shadow-on experiment per domain and the shadow-off one, all with the same arms (``served``: arm ->
    the variant serving it)."""
    arms = [{"name": arm, "variant": variant, "weight": 1} for arm, variant in served.items()]
    specs = {f"online-{domain}": {"arms": arms, "control": CONTROL, "shadow_rate": 1.0} for domain in domains}
    specs[OFF_EXPERIMENT] = {"arms": arms, "control": CONTROL, "shadow_rate": 0.0}
    return specs


@contextlib.contextmanager
def smoke_gateway(config: OnlineQualityConfig) -> Iterator[tuple[str, str, dict]]:
    """Fake vLLM backends and one in-process gateway replica: ``(url, registry_url, facts)``."""
    from depthprune.testing.gateways import fake_backends, gateway_replica

    served = {arm: (CONTROL if arm == AA_ARM else arm) for arm in config.arms}
    with fake_backends(*sorted(set(served.values()))) as urls:
        with gateway_replica(urls, None, experiments(served, config.domains)) as url:
            yield url, "sqlite:///:memory:", {"served": served, "engines": sorted(urls), "offline": {}}


@contextlib.contextmanager
def demo_gateway(config: OnlineQualityConfig) -> Iterator[tuple[str, str, dict]]:
    """``depthprune serve`` of the demo's four models with the experiments: ``(url, registry_url, facts)``."""
    from depthprune.testing.servers import running_gateway

    registry_url, registry, variants = open_demo(config)
    variants = {arm: variants[arm] for arm in config.arms}
    served = {arm: ("dense" if info.is_dense else info.name) for arm, info in variants.items()}
    engines = sorted(set(served.values()), key=list(served.values()).index)
    check_memory(len(engines), config.kv_cache_gib)
    spec = config.home / "online-quality" / "gateway.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"experiments": experiments(served, config.domains)}, indent=1))
    options = [*SERVE_OPTIONS, "--registry", registry_url, "--config", str(spec)]
    options += ["--kv-cache-gib", str(config.kv_cache_gib), "--allow-unfit", "--start-timeout", "900"]
    options += ["--log-level", "warning"]
    facts = {
        "served": served,
        "engines": engines,
        "variants": {arm: _variant_facts(info) for arm, info in variants.items()},
        "offline": offline_yardstick(registry, variants),
        "memory_available_gib_before": _available_gib(),
    }
    log = config.home / "online-quality" / "serve.log"
    env = {"DEPTHPRUNE_HOME": str(config.home)}
    with running_gateway(",".join(engines), log, *options, env=env, timeout_s=1800) as gateway:
        facts["memory_available_gib_serving"] = _available_gib()
        facts["serving_rss_gib"] = tree_rss_gib(gateway.process.pid)
        yield gateway.url, registry_url, facts


ENGINE_GIB = 3.0
"""Memory one SmolLM2-135M vLLM CPU engine takes beside its KV cache, GiB (its three processes' resident
sets add up to about 4.5 with 1 GiB of KV cache: API server 0.9, engine core 0.85, worker 2.7, shared
library pages counted in each)."""


def check_memory(engines: int, kv_cache_gib: int) -> None:
    """Refuse (one line, with the way out) when the engines would not fit the memory available now."""
    needed = engines * (ENGINE_GIB + kv_cache_gib) + 0.5
    available = _available_gib()
    if available is not None and available < needed:
        raise SystemExit(
            f"{engines} vLLM engines need about {needed:.1f} GiB and {available:.1f} GiB is available now: "
            "wait for the machine's other engines to stop, or serve fewer arms (--variants ppl-best,ce-best)"
        )


def _variant_facts(info) -> dict:
    return {
        "name": info.name,
        "removed_blocks": list(info.removed_blocks),
        "objective": (info.calibration or {}).get("objective"),
        "fit": getattr(info, "fit", None),
        "parent": info.parent,
    }


def tree_rss_gib(root: int) -> float:
    """Resident memory of a process and all its descendants (the gateway and its vLLM engines), GiB."""
    parents, rss = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
            rss[int(stat.parent.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    tree, grown = {root}, True
    while grown:
        added = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | added, bool(added)
    return round(sum(rss.get(pid, 0) for pid in tree) / 2**30, 2)


def _available_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if "MemAvailable" in line)
        return round(int(line.split()[1]) / 2**20, 1)
    return None


def offline_yardstick(registry, variants: dict) -> dict[str, dict]:
    """Per arm and offline perplexity task: perplexity, n windows, retention of dense's with its paired
    interval (:func:`pruning.evaluation.paired.recorded_comparison` of what the demo recorded)."""
    from pruning.evaluation.paired import recorded_comparison

    names = {arm: info.name for arm, info in variants.items() if arm != AA_ARM}
    compared = {
        entry["model"]: entry["tasks"] for entry in recorded_comparison(registry, list(names.values()))
    }
    table = {}
    for arm, name in names.items():
        table[arm] = {}
        for task in OFFLINE_TASKS:
            record = compared.get(name, {}).get(task)
            if record is None:
                continue
            item = {key: record.get(key) for key in ("perplexity", "perplexity_ci95", "n", "retention")}
            item["retention_ci95"] = record.get("retention_ci95")
            if arm == CONTROL:
                item["retention"], item["retention_ci95"] = 100.0, [100.0, 100.0]
            table[arm][task] = item
    table[AA_ARM] = table.get(CONTROL, {})
    return table


# ------------------------------------------------------------------------------ requests and looks


@dataclass
class Ledger:
    """What the driver has sent and seen."""

    answered: dict[str, int] = field(default_factory=dict)
    """Experiment -> requests answered 200 (each one shadow-sampled in a shadow-on experiment)."""
    failures: list[dict] = field(default_factory=list)
    """Requests not answered 200: experiment, arm, status or error."""


def ask(
    client, url: str, model: str, arm: str | None, prompt: str, config, user: str
) -> tuple[str, str, Any]:
    """One streamed sampled completion of ``model``, forced to ``arm`` (an experiment's) unless None;
    ``(model, arm, status or error)``."""
    body = {"model": model, "prompt": prompt, "max_tokens": config.max_tokens, "stream": True}
    body.update(temperature=config.temperature, user=user)
    headers = {"x-depthprune-arm": arm} if arm else {}
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
            for _ in r.iter_bytes():
                pass
            return model, arm, r.status_code
    except Exception as error:  # a failed request is recorded, the run goes on
        return model, arm, f"{type(error).__name__}: {error}"


SNAPSHOT_FAMILIES = ("arm_moments", "shadow_scored", "shadow_dropped")
"""The gateway's metric families a snapshot reads (its latency histograms are left to the report)."""


def snapshot(url: str, names: list[str]) -> dict[str, Any]:
    """Per experiment and arm: moments per measure, scored and dropped (one ``/metrics`` read).

    Only the lines of :data:`SNAPSHOT_FAMILIES` are parsed: prometheus_client's parser takes about a
    millisecond per sample on these cores, and the histograms are most of the text.
    """
    import httpx

    from server.experiment_report import PREFIX, arm_traffic

    wanted = tuple(PREFIX + family for family in SNAPSHOT_FAMILIES)
    text = httpx.get(f"{url}/metrics", timeout=30).text
    kept = [line for line in text.splitlines() if re.sub(r"^# (HELP|TYPE) ", "", line).startswith(wanted)]
    return {name: arm_traffic(["\n".join(kept) + "\n"], name) for name in names}


BLOCK_MEASURES = ("tpot", "e2el", "dense_nll", "top1_agreement")
"""What a block records per arm: both latencies, and (shadow-on blocks) both shadow scores."""


def block_moments(
    before: dict, after: dict, names: list[str], arms: tuple[str, ...]
) -> dict[str, dict[str, dict]]:
    """Per arm and measure, the moments the block added (summed over ``names``)."""
    from server.sequential import Moments

    moments: dict[str, dict[str, dict]] = {}
    for arm in arms:
        for measure in BLOCK_MEASURES:
            added = Moments()
            for name in names:
                now = after[name].get(arm)
                then = before[name].get(arm)
                added += (now.moments.get(measure, Moments()) if now else Moments()) - (
                    then.moments.get(measure, Moments()) if then else Moments()
                )
            moments.setdefault(arm, {})[measure] = asdict(added)
    return moments


def wait_for_scores(url: str, names: list[str], ledger: Ledger, timeout_s: float = 900) -> float:
    """Wait until every answered request of ``names`` is scored or dropped; returns the seconds waited."""
    started = time.monotonic()
    while True:
        seen = snapshot(url, names)
        done = all(
            sum(arm.shadow_scored + arm.shadow_dropped for arm in seen[name].values())
            >= ledger.answered.get(name, 0)
            for name in names
        )
        if done or time.monotonic() - started > timeout_s:
            return time.monotonic() - started
        time.sleep(0.5)


def look(url: str, name: str, registry_url: str, number: int) -> dict[str, Any]:
    """One read of the experiment's report, kept as the looks need it (and whole)."""
    from server.experiment_report import report

    result = report(name, [url], registry_url=registry_url)
    return {
        "look": number,
        "scored": {arm["name"]: arm["shadow_scored"] for arm in result["arms"]},
        "answered": {arm["name"]: arm["tpot"]["count"] for arm in result["arms"]},
        "arms": {arm["name"]: arm["vs_control"] for arm in result["arms"] if "vs_control" in arm},
        # what the verdicts were computed from: the look can be recomputed from the record alone
        "moments": {arm["name"]: arm["moments"] for arm in result["arms"]},
        "control": result["control"],
        "margin": result["margin"],
        "report": result,
    }


def block_jobs(phase: str, config: OnlineQualityConfig, prompts: dict[str, Iterator[str]]) -> list[tuple]:
    """``(experiment, arm, prompt)`` of one block, arms and domains interleaved."""
    jobs = []
    for _ in range(config.block_requests):
        for domain in config.domains:
            name = f"online-{domain}" if phase == "on" else OFF_EXPERIMENT
            prompt = next(prompts[domain])
            jobs += [(name, arm, prompt) for arm in config.arms]
    return jobs


def over_budget(config: OnlineQualityConfig, elapsed_s: float, blocks_done: int) -> bool:
    """Whether one more ABBA group of four blocks would end past ``config.time_budget_s``."""
    if config.time_budget_s is None:
        return False
    return elapsed_s + 4 * elapsed_s / blocks_done > config.time_budget_s


def send_block(client, url: str, pools: dict, jobs: list[tuple], config, ledger: Ledger, block: int) -> None:
    """Send a block's requests, each arm's through its own pool, and count what was answered."""
    futures = [
        pools[arm].submit(ask, client, url, name, arm, prompt, config, f"b{block}-r{index}")
        for index, (name, arm, prompt) in enumerate(jobs)
    ]
    for future in futures:
        name, arm, status = future.result()
        if status == 200:
            ledger.answered[name] = ledger.answered.get(name, 0) + 1
        else:
            ledger.failures.append({"experiment": name, "arm": arm, "status": status})


def run_blocks(
    url: str, registry_url: str, config: OnlineQualityConfig, engines: list[str]
) -> dict[str, Any]:
    """Warm up every engine, then the ABBA blocks (phase, seconds, load and moments of each) and the looks."""
    import httpx

    on_names = [f"online-{domain}" for domain in config.domains]
    count = 2 * config.blocks * config.block_requests + len(engines)  # a round's prompt serves every arm
    prompts = {d: iter(held_out_prompts(d, count, config.prompt_words, config.seed)) for d in config.domains}
    ledger, blocks, looks, off_looks = Ledger(), [], {name: [] for name in on_names}, []
    with httpx.Client(timeout=600) as client, contextlib.ExitStack() as stack:
        pools = {arm: ThreadPoolExecutor(config.concurrency) for arm in config.arms}
        for pool in pools.values():
            # On an interrupt the block's queued requests are dropped, not sent: waiting for them (a pool's
            # default exit) kept a stopped run alive for minutes with its engines up
            stack.callback(pool.shutdown, wait=False, cancel_futures=True)
        warm = [(engine, None, next(prompts[config.domains[0]])) for engine in engines]
        list(pools[CONTROL].map(lambda job: ask(client, url, *job, config, "warm-up"), warm * 2))
        measuring = time.monotonic()
        for number, phase in enumerate(abba_phases(config.blocks)):
            if number % 4 == 0 and number and over_budget(config, time.monotonic() - measuring, number):
                break
            names = on_names if phase == "on" else [OFF_EXPERIMENT]
            jobs = block_jobs(phase, config, prompts)
            before, started, load = snapshot(url, names), time.monotonic(), os.getloadavg()[0]
            send_block(client, url, pools, jobs, config, ledger, number)
            seconds = time.monotonic() - started
            drained = wait_for_scores(url, names, ledger) if phase == "on" else 0.0
            after = snapshot(url, names)
            blocks.append(
                {
                    "block": number,
                    "phase": phase,
                    "requests": len(jobs),
                    "seconds": round(seconds, 1),
                    "drain_seconds": round(drained, 1),
                    "load_1min": load,
                    "moments": block_moments(before, after, names, config.arms),
                }
            )
            if phase == "on":
                for name in on_names:
                    looks[name].append(look(url, name, registry_url, len(looks[name]) + 1))
            else:
                off_looks.append(look(url, OFF_EXPERIMENT, registry_url, len(off_looks) + 1))
            print(
                f"block {number + 1}/{2 * config.blocks} ({phase}): {len(jobs)} requests in {seconds:.0f} s, "
                f"scores drained in {drained:.0f} s, load {load:.1f}",
                file=sys.stderr,
            )
    return {"blocks": blocks, "looks": looks, "off_looks": off_looks, "ledger": asdict(ledger)}


# ------------------------------------------------------------------------------ the record


def reading(run: dict[str, Any], facts: dict, config: OnlineQualityConfig) -> dict[str, Any]:
    """The record's findings from the run: per domain the final report, looks, first decisions, order."""
    domains = {}
    for domain in config.domains:
        looks = run["looks"][f"online-{domain}"]
        final = looks[-1]["report"]
        online = {arm["name"]: arm["vs_control"] for arm in final["arms"] if "vs_control" in arm}
        offline = facts["offline"]
        order = {
            task: order_comparison(
                online, {arm: offline[arm][task] for arm in online if task in offline.get(arm, {})}
            )
            for task in OFFLINE_TASKS
            if offline
        }
        domains[domain] = {
            "final": final,
            "looks": [{key: value for key, value in item.items() if key != "report"} for item in looks],
            "first_decisions": {arm: first_decisions(looks, arm) for arm in config.arms[1:]},
            "order": order,
        }
    off = run["off_looks"]
    return {
        "domains": domains,
        "off_phase": off[-1]["report"],
        "off_first_decisions": {arm: first_decisions(off, arm)["speed"] for arm in config.arms[1:]},
        "shadow_cost": {
            arm: {measure: phase_cost(run["blocks"], arm, measure) for measure in ("tpot", "e2el")}
            for arm in config.arms
        },
    }


def machine() -> dict[str, Any]:
    """Cores, memory and the load when asked (this machine is shared)."""
    return {"cores": os.cpu_count(), "memory_available_gib": _available_gib(), "load": list(os.getloadavg())}


def run(config: OnlineQualityConfig, command: str) -> dict[str, Any]:
    """The whole benchmark; returns the record (written to ``config.out`` when set)."""
    if config.smoke:
        config = OnlineQualityConfig(**{**asdict(config), **SMOKE})
    started, at_start = time.time(), machine()
    gateway = smoke_gateway if config.smoke else demo_gateway
    with gateway(config) as (url, registry_url, facts):
        serving_started = time.time()
        measured = run_blocks(url, registry_url, config, facts["engines"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    record = {
        "benchmark": "benchmarks.bench_online_quality",
        "command": command,
        "commit": commit.stdout.strip(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "wall_seconds": round(time.time() - started, 1),
        "measure_seconds": round(time.time() - serving_started, 1),
        "settings": {
            key: str(value) if isinstance(value, Path) else value for key, value in asdict(config).items()
        },
        "machine": {"start": at_start, "end": machine()},
        "arms": {"control": CONTROL, "aa": AA_ARM, "variants": list(config.variants)},
        **{key: facts[key] for key in facts},
        **reading(measured, facts, config),
        "blocks": measured["blocks"],
        "failures": measured["ledger"]["failures"],
    }
    if config.home is not None:
        # a committed record names no machine's directories: the demo home is written as the variable
        record = json.loads(json.dumps(record).replace(str(config.home), HOME_PLACEHOLDER))
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def parse_args(argv: list[str] | None = None) -> tuple[OnlineQualityConfig | None, Path | None]:
    """The config from the command line (or the record to render with ``--render``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = OnlineQualityConfig(smoke=True)
    parser.add_argument("--home", type=Path, help="a finished `depthprune demo` home (DEPTHPRUNE_HOME)")
    parser.add_argument("--run-demo", action="store_true", help="run `depthprune demo` there first if absent")
    parser.add_argument(
        "--out", type=Path, help="the JSON record (e.g. docs/online-quality/smollm2-135m.json)"
    )
    for name in (
        "blocks",
        "block_requests",
        "max_tokens",
        "prompt_words",
        "concurrency",
        "kv_cache_gib",
        "seed",
    ):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--time-budget-s", type=float, help="no ABBA group begins that would end past it")
    parser.add_argument(
        "--domains", default=",".join(defaults.domains), help="pydoc,gcide (held-out prompts)"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANT_ARMS), help="variant arms beside dense, dense-aa"
    )
    parser.add_argument("--smoke", action="store_true", help="fake vLLM backends, a few requests (seconds)")
    parser.add_argument("--render", type=Path, help="print the docs tables of a record and exit")
    args = parser.parse_args(argv)
    if args.render:
        return None, args.render
    options = {key: value for key, value in vars(args).items() if key != "render"}
    for name in ("domains", "variants"):
        options[name] = tuple(part.strip() for part in getattr(args, name).split(",") if part.strip())
    return OnlineQualityConfig(**options), None


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    # Ctrl-C and SIGTERM stop the engines on the way out, also when started in the background (where a shell
    # starts the command with SIGINT ignored)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    config, render = parse_args(argv)
    if render is not None:
        print(markdown(json.loads(render.read_text())))
        return
    argv = sys.argv[1:] if argv is None else argv
    record = run(config, " ".join(["python -m benchmarks.bench_online_quality", *argv]))
    print(markdown(record))
    if config.out is None and not config.smoke:
        print(json.dumps(record)[:2000], file=sys.stderr)


if __name__ == "__main__":
    main()
