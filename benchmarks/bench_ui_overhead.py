"""Benchmark: does looking at the experiment page (``/ui/``) slow ``/v1`` or change its routing?

A ``depthprune serve`` gateway (its own process, as in production) over two fake vLLM servers (processes of
:mod:`depthprune.testing.fake_vllm`, ``fake_delay`` per token so that a request takes tens of milliseconds)
routes an experiment of three arms (``dense``, the A/A arm ``dense-aa``, ``twin``; shadow rate 0.5). A client
keeps ``--concurrency`` completions in flight for the whole run, in blocks of ``--block-s`` seconds in ABBA
order of two phases (off, on, on, off, ...): in the *on* blocks ``--viewers`` pages poll the page's data as
the page does (the experiment's state every second, its series after each sample, each viewer at its own
offset), in the *off* blocks nothing looks. Per block the mean end-to-end latency of the completions started
in it; the page's cost is the on/off ratio over adjacent mixed pairs, and the same-phase pairs are its A/A
control (:func:`benchmarks.online_quality_reading.phase_cost`: Student's t on per-pair log-ratios). Routing:
40 users are routed before and after the run and must keep their arms (sticky), and the version must not
move::

    python -m benchmarks.bench_ui_overhead [--blocks 8] [--block-s 6] [--viewers 10] [--concurrency 4]

It prints one JSON record; docs/experiments.md ("The experiment page") gives the reading.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from benchmarks.bench_gateway import process_cpu_seconds
from benchmarks.online_quality_reading import abba_phases, phase_cost
from depthprune.testing.servers import free_port, running, running_gateway
from server.sequential import Moments

ADMIN_TOKEN = "bench"
EXPERIMENT = {
    "arms": [
        {"name": "dense", "variant": "dense"},
        {"name": "dense-aa", "variant": "dense"},
        {"name": "twin", "variant": "twin"},
    ],
    "sticky": True,
    "shadow_rate": 0.5,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8, help="pairs of blocks (ABBA order)")
    parser.add_argument("--block-s", type=float, default=6.0, help="seconds per block")
    parser.add_argument("--viewers", type=int, default=10, help="pages polling during the 'on' blocks")
    parser.add_argument("--concurrency", type=int, default=4, help="completions kept in flight")
    parser.add_argument("--series-interval-s", type=float, default=10.0, help="the gateway's sampling")
    return parser.parse_args()


async def load(client: httpx.AsyncClient, url: str, until: float, latencies: list[tuple[float, float]]):
    """Completions one after another until ``until``: (start, seconds) of each."""
    user = 0
    while time.monotonic() < until:
        user += 1
        body = {"model": "ab", "prompt": f"user {user} asks", "max_tokens": 8, "fake_delay": 0.004}
        started = time.monotonic()
        response = await client.post(f"{url}/v1/completions", json={**body, "user": f"load{user % 97}"})
        if response.status_code != 200:
            raise RuntimeError(f"/v1/completions answered {response.status_code}: {response.text[:200]}")
        latencies.append((started, time.monotonic() - started))


async def view(client: httpx.AsyncClient, url: str, looking: asyncio.Event, offset_s: float, counts: list):
    """One page, as page.js does it: while ``looking`` is set, the experiment's state every second and its
    series' new points after each new sample (``counts`` gets the seconds each refresh took)."""
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    await asyncio.sleep(offset_s)
    seq, samples = -1, None
    while True:
        await looking.wait()
        started = time.monotonic()
        state = await client.get(f"{url}/ui/api/experiments/ab", headers=headers)
        if state.status_code != 200:
            raise RuntimeError(f"the page's data answered {state.status_code}: {state.text[:200]}")
        if state.json()["samples"] != samples:
            series = await client.get(f"{url}/ui/api/experiments/ab/series?after={seq}", headers=headers)
            points = series.json()["points"]
            seq, samples = (points[-1]["seq"] if points else seq), state.json()["samples"]
        counts.append(time.monotonic() - started)
        await asyncio.sleep(1.0)


async def arms_of(client: httpx.AsyncClient, url: str) -> list[str]:
    body = {"model": "ab", "prompt": "w", "max_tokens": 1}
    answers = [await client.post(f"{url}/v1/completions", json={**body, "user": f"u{u}"}) for u in range(40)]
    return [answer.headers["x-depthprune-arm"] for answer in answers]


async def measure(url: str, args, gateway_pid: int) -> dict:
    """The blocks of the run, and the routing before and after."""
    limits = httpx.Limits(max_connections=args.concurrency + 2 * args.viewers + 4)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        routed_before = await arms_of(client, url)
        version_before = (await client.get(f"{url}/admin/experiments/ab", headers=_admin())).headers["etag"]
        looking, page_reads = asyncio.Event(), []
        viewers = [
            asyncio.create_task(view(client, url, looking, index / max(1, args.viewers), page_reads))
            for index in range(args.viewers)
        ]
        blocks = []
        for phase in abba_phases(args.blocks):
            looking.set() if phase == "on" else looking.clear()
            latencies: list[tuple[float, float]] = []
            start, cpu = time.monotonic(), process_cpu_seconds(gateway_pid)
            until = start + args.block_s
            await asyncio.gather(*(load(client, url, until, latencies) for _ in range(args.concurrency)))
            stream = Moments()
            for _, seconds in latencies:
                stream = stream.add(seconds)
            # the gateway's CPU per /v1 request: what the page costs it, less sensitive to the machine's
            # other load than latency is
            cpu_ms = 1000 * (process_cpu_seconds(gateway_pid) - cpu) / max(1, len(latencies))
            moments = {"v1": {"e2el": stream, "cpu": Moments().add(cpu_ms)}}
            blocks.append({"phase": phase, "moments": moments, "requests": len(latencies)})
        for task in viewers:
            task.cancel()
        routed_after = await arms_of(client, url)
        version_after = (await client.get(f"{url}/admin/experiments/ab", headers=_admin())).headers["etag"]
    cost, cpu = phase_cost(blocks, "v1", "e2el"), phase_cost(blocks, "v1", "cpu")
    return {
        "on_over_off": cost["on_over_off"],
        "same_phase": cost["same_phase"],
        "cpu_per_request_on_over_off": cpu["on_over_off"],
        "cpu_per_request_same_phase": cpu["same_phase"],
        "blocks": [
            {
                "phase": b["phase"],
                "requests": b["requests"],
                "mean_ms": 1000 * b["moments"]["v1"]["e2el"].mean,
                "gateway_cpu_ms_per_request": b["moments"]["v1"]["cpu"].mean,
            }
            for b in blocks
        ],
        "page_refreshes": len(page_reads),
        "page_refresh_ms": 1000 * sum(page_reads) / max(1, len(page_reads)),
        "routing_unchanged": routed_before == routed_after,
        "version_unchanged": version_before == version_after,
    }


def _admin() -> dict:
    return {"authorization": f"Bearer {ADMIN_TOKEN}"}


def main() -> None:
    args = parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_ui_"))
    config = folder / "gateway.json"
    config.write_text(
        json.dumps({"experiments": {"ab": EXPERIMENT}, "series_interval_s": args.series_interval_s})
    )
    with ExitStack() as stack:
        backends = {}
        for name in ("dense", "twin"):
            port = free_port()
            command = [sys.executable, "-m", "depthprune.testing.fake_vllm", "--model", "x"]
            command += ["--served-model-name", name, "--port", str(port)]
            stack.enter_context(running(command, f"http://127.0.0.1:{port}", folder / f"{name}.log"))
            backends[name] = f"http://127.0.0.1:{port}"
        variants = ",".join(f"{name}={url}" for name, url in backends.items())
        options = ("--config", str(config), "--admin-token", ADMIN_TOKEN)
        env = {"DEPTHPRUNE_HOME": str(folder / "home")}
        gateway = stack.enter_context(running_gateway(variants, folder / "gateway.log", *options, env=env))
        started = time.time()
        result = asyncio.run(measure(gateway.url, args, gateway.process.pid))
    record = {
        "when": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "settings": vars(args),
        **result,
    }
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
