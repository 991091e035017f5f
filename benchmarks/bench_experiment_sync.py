"""Benchmark: how long an experiment change made on one gateway replica takes to route on another.

Two in-process gateways (default ``experiments_poll_s`` of 1 s) on one registry, fake vLLM backends ``dense``
and ``twin``; each round PUTs the experiment on replica A (alternately all-dense and all-twin) and times until
replica B routes a user to the new arm. Once on a SQLite file (version polling), once on a throwaway
PostgreSQL server (LISTEN/NOTIFY, polling as backstop; skipped without its binaries)::

    python -m benchmarks.bench_experiment_sync [--rounds 10]

Results are recorded in docs/experiments.md ("Propagation").
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

import httpx

from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.postgres import TemporaryPostgres, create_database_at, find_postgres_bin
from depthprune.testing.servers import free_port
from server import BackendSpec, GatewaySettings, create_app

ADMIN = {"authorization": "Bearer bench"}


def only(arm: str) -> dict:
    """A spec sending every user to ``arm``."""
    return {"arms": [{"variant": name, "weight": int(name == arm)} for name in ("dense", "twin")]}


def routed_to(gateway: str) -> str | None:
    response = httpx.post(f"{gateway}/v1/completions", json={"model": "ab", "prompt": "w", "user": "u1"})
    return response.headers.get("x-depthprune-variant") if response.status_code == 200 else None


def measure(backends: dict[str, str], registry_url: str, rounds: int) -> list[float]:
    """Seconds from each PUT's answer on A until B routes by it."""

    def replica():
        specs = [BackendSpec(name, url=url) for name, url in backends.items()]
        settings = GatewaySettings(backends=specs, admin_token="bench", experiments_registry=registry_url)
        return serve_in_thread(create_app(settings), free_port())

    a, b = replica(), replica()
    times = []
    try:
        for index in range(rounds):
            arm = ("dense", "twin")[index % 2]
            httpx.put(f"{a.url}/admin/experiments/ab", json=only(arm), headers=ADMIN).raise_for_status()
            started = time.monotonic()
            while routed_to(b.url) != arm:
                time.sleep(0.01)
            times.append(time.monotonic() - started)
            time.sleep(0.3)  # let the next change start at a random point of the poll cycle
    finally:
        a.stop()
        b.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    fakes = {name: serve_in_thread(create_fake_app(name), free_port()) for name in ("dense", "twin")}
    backends = {name: server.url for name, server in fakes.items()}
    sqlite_url = f"sqlite:///{tempfile.mkdtemp()}/registry.db"
    results = {"SQLite file (version poll)": measure(backends, sqlite_url, rounds)}
    if find_postgres_bin() is not None:
        with TemporaryPostgres() as server:
            url = create_database_at(server.admin_url, f"bench_{uuid.uuid4().hex[:8]}")
            results["PostgreSQL (LISTEN/NOTIFY)"] = measure(backends, url, rounds)
    for label, times in results.items():
        print(f"{label}: {rounds} changes, median {statistics.median(times):.3f} s, max {max(times):.3f} s")
    for server in fakes.values():
        server.stop()


if __name__ == "__main__":
    main()
