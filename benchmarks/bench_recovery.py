"""Benchmark: how the gateway recovers from a ``kill -9`` of a backend, and whether it leaks under traffic.

What it does (every process it starts is stopped at the end):
1. registers a tiny random Llama (``dense``) and a variant of it without block 1 (``pruned``) in a fresh
   registry, and starts ``depthprune serve --variants dense,pruned`` (its own process, managed vLLM CPU
   servers, the gateway's default health interval and restart policy) with an experiment ``ab`` whose two
   arms are dense and pruned, no fallback;
2. leak check: the gateway's RSS and open file descriptors after a warm-up, then after ``--requests`` mixed
   requests at ``--concurrency`` (completions streaming or not, to each variant and to the experiment, model
   lists, and requests the gateway refuses with a 4xx), then after the recoveries;
3. recovery, ``--kills`` times: steady traffic to the experiment (``--rate`` requests/s per arm, each arm
   forced by the ``x-depthprune-arm`` header, so every request's arm is known) while ``/ready`` is polled
   every 50 ms; ``kill -9`` of pruned's vLLM API server; measured from the kill: when ``/ready`` shows it
   down (detection), when it is up again, and when the first request sent after the kill is answered by
   it; requests that failed between the kill and that moment, per arm;
4. prints JSON and writes ``## Recovery`` into docs/benchmarks.md unless ``--no-write``.

Run: ``heavy .venv/bin/python -m benchmarks.bench_recovery`` (about 10 minutes on 2 cores, most of it
vLLM starting and restarting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from benchmarks.docs_section import write_section
from depthprune.testing.models import save_tiny_model
from depthprune.testing.servers import running_gateway
from ground.core.checksums import weights_sha256
from pruning.model.checkpoint import write_pruned_checkpoint

SECTION = "## Recovery"
PROMPT = " ".join(f"w{i}" for i in range(10, 26))  # 16 words of the tiny tokenizer's vocabulary
ARM_HEADER = "x-depthprune-arm"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3, help="Backend kills (recoveries measured).")
    parser.add_argument("--rate", type=float, default=5.0, help="Requests per second per arm while killing.")
    parser.add_argument("--requests", type=int, default=5000, help="Mixed requests of the leak check.")
    parser.add_argument("--concurrency", type=int, default=16, help="Concurrent mixed requests.")
    parser.add_argument("--no-write", action="store_true", help="Do not write docs/benchmarks.md.")
    parser.add_argument("--out", type=Path, help="Also write the JSON result here.")
    parser.add_argument(
        "--from-json", type=Path, help="Only write the section from the JSON result of an earlier run."
    )
    return parser.parse_args()


def register_models(work: Path) -> str:
    """A registry with the tiny Llama as ``dense`` and its variant without block 1 as ``pruned``."""
    from dataclasses import replace

    from registry import open_registry

    base = save_tiny_model("llama", work / "tiny-llama")
    calibration = {"objective": "perplexity", "data": "none (benchmark)"}
    written = write_pruned_checkpoint(str(base), [1], work / "pruned", calibration=calibration)
    url = f"sqlite:///{work / 'registry.db'}"
    with open_registry(url) as registry:
        registry.register_base_model(
            str(base), revision=None, weights_sha256=weights_sha256(base), num_blocks=6, architecture="llama"
        )
        registry.register_variant(replace(written.variant, name="pruned"))
    return url


def gateway_config(work: Path) -> Path:
    """``serve --config``: vLLM in eager mode with a short context, the experiment ``ab`` (no fallback)."""
    config = {
        "vllm": {
            "dtype": "float32",
            "max_model_len": 256,
            "log_dir": str(work),
            "start_timeout_s": 900,
            "extra_args": ["--enforce-eager"],
        },
        "experiments": {
            "ab": {"arms": [{"variant": "dense", "weight": 1}, {"variant": "pruned", "weight": 1}]}
        },
    }
    path = work / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def completion(model: str, stream: bool = False, max_tokens: int = 4) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


async def send(client: httpx.AsyncClient, method: str, url: str, **kwargs) -> int:
    """Status of one request read to its end; 0 when no answer came (connection error or timeout)."""
    try:
        async with client.stream(method, url, **kwargs) as response:
            async for _ in response.aiter_raw():
                pass
            return response.status_code
    except httpx.HTTPError:
        return 0


def mixed_request(index: int, url: str) -> tuple[str, str, dict]:
    """The ``index``-th request of the leak check: (method, URL, httpx arguments), seven kinds in turn."""
    kind = index % 7
    if kind == 0:
        return "POST", f"{url}/v1/completions", {"json": completion("dense")}
    if kind == 1:
        return "POST", f"{url}/v1/completions", {"json": completion("pruned", stream=True)}
    if kind in (2, 3):  # the experiment; the user id picks the arm
        headers = {"x-depthprune-user": f"user-{index}"}
        return (
            "POST",
            f"{url}/v1/completions",
            {"json": completion("ab", stream=kind == 3), "headers": headers},
        )
    if kind == 4:
        return "GET", f"{url}/v1/models", {}
    if kind == 5:  # refused by the gateway's validation
        return "POST", f"{url}/v1/completions", {"json": completion("dense", max_tokens=-1)}
    return "POST", f"{url}/v1/completions", {"json": completion("no-such-model")}


async def mixed_traffic(url: str, requests: int, concurrency: int) -> dict:
    """Status counts and wall time of ``requests`` mixed requests with at most ``concurrency`` in flight."""
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(index: int) -> int:
            method, target, kwargs = mixed_request(index, url)
            async with semaphore:
                return await send(client, method, target, **kwargs)

        start = time.perf_counter()
        statuses = await asyncio.gather(*(one(index) for index in range(requests)))
    return {
        "requests": requests,
        "seconds": round(time.perf_counter() - start, 1),
        "statuses": dict(sorted(Counter(str(status) for status in statuses).items())),
    }


def gateway_resources(pid: int) -> dict:
    """RSS (MiB) and open file descriptors of the gateway process itself (not its vLLM children)."""
    process = psutil.Process(pid)
    return {
        "rss_mib": round(process.memory_info().rss / 2**20, 1),
        "fds": process.num_fds(),
        "connections": len(process.net_connections(kind="tcp")),
    }


def api_server_of(backend_pid: int) -> psutil.Process:
    """The vLLM API server among a managed backend's processes (not its supervisor, not the engine)."""
    leader = psutil.Process(backend_pid)
    for process in [leader, *leader.children(recursive=True)]:
        command_line = " ".join(process.cmdline())
        if "vllm.entrypoints.openai.api_server" in command_line and "supervisor" not in command_line:
            return process
    raise RuntimeError(f"no vLLM API server under pid {backend_pid}")


async def poll_ready(
    client: httpx.AsyncClient, url: str, name: str, states: list, stop: asyncio.Event
) -> None:
    """Append ``(time, up, restarts)`` of backend ``name`` every 50 ms until ``stop`` is set."""
    while not stop.is_set():
        try:
            backend = (await client.get(f"{url}/ready", timeout=2)).json()["backends"][name]
            states.append((time.monotonic(), backend["up"], backend["restarts"]))
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        await asyncio.sleep(0.05)


async def steady_traffic(client, url: str, rate: float, records: list, stop: asyncio.Event) -> None:
    """Requests to the experiment at ``rate``/s per arm, each arm forced; ``records`` gets
    ``(sent, arm, status, done)``. Requests are not awaited one by one: a slow answer delays no other."""
    tasks = []

    async def one(arm: str) -> None:
        sent = time.monotonic()
        status = await send(
            client, "POST", f"{url}/v1/completions", json=completion("ab"), headers={ARM_HEADER: arm}
        )
        records.append((sent, arm, status, time.monotonic()))

    while not stop.is_set():
        tasks += [asyncio.create_task(one(arm)) for arm in ("dense", "pruned")]
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*tasks)


async def one_recovery(url: str, rate: float) -> dict:
    """Kill pruned's API server under steady traffic; times from the kill and requests lost per arm."""
    states, records, stop = [], [], asyncio.Event()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        ready = (await client.get(f"{url}/ready")).json()["backends"]["pruned"]
        restarts_before = ready["restarts"]
        tasks = [
            asyncio.create_task(poll_ready(client, url, "pruned", states, stop)),
            asyncio.create_task(steady_traffic(client, url, rate, records, stop)),
        ]
        await asyncio.sleep(5)  # steady state first
        killed_at = time.monotonic()
        os.kill(api_server_of(ready["pid"]).pid, signal.SIGKILL)
        served_again = None
        while served_again is None and time.monotonic() - killed_at < 900:
            await asyncio.sleep(0.2)
            answered = [r for r in records if r[1] == "pruned" and r[0] > killed_at and r[2] == 200]
            served_again = min((r[3] for r in answered), default=None)
        await asyncio.sleep(5)  # and steady state after
        stop.set()
        await asyncio.gather(*tasks)
    detected = next((t for t, up, _ in states if t > killed_at and not up), None)
    up_again = next((t for t, up, n in states if t > killed_at and up and n > restarts_before), None)
    window_end = served_again or time.monotonic()

    def lost(arm: str) -> dict:
        during = [r for r in records if r[1] == arm and r[3] > killed_at and r[0] < window_end]
        statuses = Counter(str(r[2]) for r in during if r[2] != 200)
        return {"sent": len(during), "failed": sum(statuses.values()), "statuses": dict(statuses)}

    def since_kill(moment):
        return None if moment is None else round(moment - killed_at, 2)

    return {
        "detection_s": since_kill(detected),
        "ready_again_s": since_kill(up_again),
        "serving_again_s": since_kill(served_again),
        "lost": {arm: lost(arm) for arm in ("pruned", "dense")},
        "failed_other_arm_outside_window": sum(
            r[2] != 200 for r in records if r[1] == "dense" and not (r[3] > killed_at and r[0] < window_end)
        ),
    }


def gateway_events(log: Path) -> dict:
    """How often the gateway's log says a backend went down or was restarted, by backend and reason."""
    events = Counter()
    for line in log.read_text(errors="replace").splitlines():
        for marker in ("is down:", "restarting backend", "refused", "Traceback"):
            if marker in line:
                events[line.split(": ", 1)[-1][:160]] += 1
    return dict(events.most_common(20))


def median(values: list) -> float | None:
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 2) if values else None


def measure(url: str, pid: int, args) -> dict:
    """The leak check, then the recoveries, with the machine's load before and after each."""
    result = {"load_average": {"start": round(os.getloadavg()[0], 2)}}
    asyncio.run(mixed_traffic(url, 200, args.concurrency))  # warm-up: connections, engine caches
    result["resources_before"] = gateway_resources(pid)
    result["mixed"] = asyncio.run(mixed_traffic(url, args.requests, args.concurrency))
    result["resources_after_mixed"] = gateway_resources(pid)
    result["load_average"]["after_mixed"] = round(os.getloadavg()[0], 2)
    recoveries = []
    for kill in range(args.kills):
        print(f"kill {kill + 1}/{args.kills} ...", file=sys.stderr)
        recoveries.append(asyncio.run(one_recovery(url, args.rate)))
        print(json.dumps(recoveries[-1]), file=sys.stderr)
    result["recoveries"] = recoveries
    result["resources_after_recoveries"] = gateway_resources(pid)
    result["load_average"]["end"] = round(os.getloadavg()[0], 2)
    result["medians"] = {
        key: median([recovery[key] for recovery in recoveries])
        for key in ("detection_s", "ready_again_s", "serving_again_s")
    }
    for arm in ("pruned", "dense"):
        result["medians"][f"failed_{arm}"] = median(
            [recovery["lost"][arm]["failed"] for recovery in recoveries]
        )
        result["medians"][f"sent_{arm}"] = median([recovery["lost"][arm]["sent"] for recovery in recoveries])
    return result


def reproduce_flags(args) -> str:
    defaults = {"kills": 3, "rate": 5.0, "requests": 5000, "concurrency": 16}
    return " ".join(
        f"--{key} {getattr(args, key)}" for key, value in defaults.items() if getattr(args, key) != value
    )


def failures(recoveries: list[dict], arm: str) -> str:
    """``503: 780, 0: 3`` over every recovery: the statuses of the failed requests of ``arm``."""
    total = Counter()
    for recovery in recoveries:
        total.update(recovery["lost"][arm].get("statuses", {}))
    return ", ".join(f"{status}: {count}" for status, count in total.most_common()) or "none"


def outside(count: int) -> str:
    """`` (+N outside it)``: other-arm failures in the 5 s before the kill or after the window."""
    return f" (+{count} outside it)" if count else ""


def recovery_text(result: dict, args) -> str:
    """The recovery table and what was lost."""
    medians, recoveries = result["medians"], result["recoveries"]
    rows = "\n".join(
        f"| {index + 1} | {r['detection_s']} | {r['ready_again_s']} | {r['serving_again_s']} | "
        f"{r['lost']['pruned']['failed']} of {r['lost']['pruned']['sent']} | "
        f"{r['lost']['dense']['failed']} of {r['lost']['dense']['sent']}"
        f"{outside(r['failed_other_arm_outside_window'])} |"
        for index, r in enumerate(recoveries)
    )
    events = result.get("gateway_log_events") or {}
    logged = "; ".join(f"`{line}` ×{count}" for line, count in events.items()) or "nothing"
    return f"""**Recovery of a killed backend** (`kill -9` of pruned's vLLM API server, {args.kills} times, under
{args.rate:g} requests/s per arm to `ab`, each arm forced with `x-depthprune-arm`). Times from the kill;
the lost requests are those in flight at the kill or sent until the first answer of the restarted server
(the window); each kill also has 5 s of steady traffic before it and after the window.

| kill | detected down (s) | `/ready` up again (s) | first answer again (s) | failed on its arm | failed on the other arm |
|---|---|---|---|---|---|
{rows}
| **median** (per column) | **{medians["detection_s"]}** | **{medians["ready_again_s"]}** | **{medians["serving_again_s"]}** | **{medians["failed_pruned"]} of {medians["sent_pruned"]}** | **{medians["failed_dense"]} of {medians["sent_dense"]}** |

Statuses of the failed requests (0: no answer), over all kills: killed arm {failures(recoveries, "pruned")};
other arm {failures(recoveries, "dense")}. The killed arm has no fallback, so its requests get 503 until it is
back (an arm with a `fallback` is served by it instead). The gateway's log during the run: {logged}.

{other_arm_text(events)}
"""  # noqa: E501


def other_arm_text(events: dict) -> str:
    """What the log says about the arm that was not killed."""
    down = [line for line in events if line.startswith("backend dense is down")]
    if not down:
        return "The other arm was never marked down: what it lost, if anything, was not the gateway's doing."
    return (
        "**The other arm's losses are the gateway's doing**: it marked the healthy dense server down "
        f"itself ({'; '.join(f'`{line}`' for line in down)}) and restarted it, while pruned's engine "
        "was starting on the same cores. A `/health` probe that fails with a transport error marks a "
        "backend down at once, with no retry on a fresh connection, and the probes keep connections alive "
        "as long as vLLM does (httpx's 5 s against vLLM's 5 s, a probe every 5 s): most likely the "
        "stale-connection race that proxied requests are protected from (issue 18, item 1), widened by "
        "CPU starvation. Probes on a fresh connection, or one retry before marking down, would close it."
    )


def markdown(result: dict, args) -> str:
    mixed, load = result["mixed"], result["load_average"]
    before, after, end = (
        result[key] for key in ("resources_before", "resources_after_mixed", "resources_after_recoveries")
    )
    statuses = ", ".join(f"{status}: {count}" for status, count in mixed["statuses"].items())
    return f"""{SECTION}

`depthprune serve --variants dense,pruned` (its own process) with two managed vLLM CPU servers (eager, float32):
a tiny random Llama (6 blocks, hidden 64) and its variant without block 1, and an experiment `ab` whose arms
are dense and pruned with no fallback. The gateway's defaults: `/health` every 5 s (3 s timeout, down after 2
timeouts in a row or any other failure; a failed request checks at once), restart with backoff from 1 s.
Machine: {platform.machine()}, {os.cpu_count()} cores shared with other jobs, Python {platform.python_version()};
load average {load["start"]} at the start, {load["after_mixed"]} after the mixed requests, {load["end"]} at the
end (this benchmark's own gateway and engines included): **every figure below was taken under that load**,
vLLM's restart time most of all.

{recovery_text(result, args)}
**Gateway process after {mixed["requests"]:,} mixed requests** (concurrency {args.concurrency}: completions
streaming or not to each variant and to the experiment, model lists, and requests refused with a 4xx;
statuses {statuses}; {mixed["seconds"]} s):

| | after a 200-request warm-up | after the {mixed["requests"]:,} requests | after the {args.kills} recoveries |
|---|---|---|---|
| RSS | {before["rss_mib"]} MiB | {after["rss_mib"]} MiB | {end["rss_mib"]} MiB |
| open file descriptors | {before["fds"]} | {after["fds"]} | {end["fds"]} |
| TCP connections | {before["connections"]} | {after["connections"]} | {end["connections"]} |

Reproduce: `{" ".join(["heavy .venv/bin/python -m benchmarks.bench_recovery", reproduce_flags(args)]).strip()}`.
"""  # noqa: E501


def main() -> None:
    args = parse_args()
    if args.from_json:
        result = json.loads(args.from_json.read_text())
        args = argparse.Namespace(**{**vars(args), **result["arguments"]})
        write_section(SECTION, markdown(result, args))
        return
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as work:
        work = Path(work)
        registry_url = register_models(work)
        options = (
            "--registry",
            registry_url,
            "--config",
            str(gateway_config(work)),
            "--log-level",
            "warning",
        )
        env = {"DEPTHPRUNE_HOME": str(work / "home")}
        print("starting the gateway and two vLLM servers ...", file=sys.stderr)
        log = work / "gateway.log"
        with running_gateway("dense,pruned", log, *options, env=env, timeout_s=900) as gateway:
            result = measure(gateway.url, gateway.process.pid, args)
        result["gateway_log_events"] = gateway_events(log)
    result["arguments"] = {key: getattr(args, key) for key in ("kills", "rate", "requests", "concurrency")}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    text = markdown(result, args)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
