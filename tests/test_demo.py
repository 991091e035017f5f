"""`depthprune demo` end to end (tiny recipe, small budget), and its process clean-up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from depthprune.demo.pipeline import DemoConfig, stop_process_group
from depthprune.errors import UserError
from depthprune.testing.servers import free_port, wait_until


def vllm_processes() -> set[int]:
    result = subprocess.run(
        ["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True
    )
    return {int(pid) for pid in result.stdout.split()}


@pytest.mark.slow
@pytest.mark.vllm
def test_demo_runs_end_to_end(tmp_path):
    before = vllm_processes()
    env = {**os.environ, "DEPTHPRUNE_HOME": str(tmp_path / "home")}
    env.pop("DEPTHPRUNE_REGISTRY_URL", None)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "depthprune",
            "demo",
            "--recipe",
            "tiny",
            "--quick",
            "--port",
            str(free_port()),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert completed.returncode == 0, completed.stderr[-5000:]
    rows = json.loads(completed.stdout.strip().splitlines()[-1])
    by_variant = {row["variant"]: row for row in rows}
    assert {"dense", "ppl-best", "margin-best"} <= set(by_variant)
    assert len(rows) == 5  # dense + (fast, thorough) x (perplexity, task margin)
    for row in rows:
        assert row["perplexity"] > 1 and 0 <= row["qa_accuracy"] <= 1
    for alias in ("ppl-best", "margin-best"):
        row = by_variant[alias]
        assert len(row["removed_blocks"]) == 2  # 25% of the tiny model's 8 blocks
        assert row["output_throughput_ratio"] > 0 and row["ideal_speedup"] == pytest.approx(8 / 6)
    assert (tmp_path / "home" / "demo" / "summary.json").is_file()
    assert "depthprune demo: every variant against dense" in completed.stderr
    assert re.search(r"^== \[\d+:\d\d\] load test", completed.stderr, re.M), "step headings show the minutes"
    assert vllm_processes() <= before, "the demo left vLLM processes behind"


def test_stop_process_group_kills_children_too():
    parent = subprocess.Popen(
        ["sh", "-c", "trap '' INT; sleep 300 & sleep 300 & wait"], start_new_session=True
    )
    time.sleep(0.5)
    stop_process_group(parent, grace_s=1)
    assert parent.returncode is not None
    # Orphaned children are reaped by init a moment after the kill.
    wait_until(lambda: group_members(parent.pid) == [], 10, "the group's children gone")


def group_members(pgid: int) -> list[str]:
    """Live (not zombie) processes of a process group."""
    listing = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True).stdout
    return [
        line
        for line in listing.splitlines()
        if line.split()[0] == str(pgid) and not line.split()[1].startswith("Z")
    ]


def test_interrupt_stops_a_cooperative_group_gracefully():
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    time.sleep(0.5)
    started = time.monotonic()
    stop_process_group(parent, grace_s=30)
    assert parent.returncode == -signal.SIGINT or parent.returncode == 1
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"recipe": "huge"}, "unknown recipe"),
        ({"drop_fraction": 1.0}, "drop-fraction"),
        ({"samples": 0}, "--samples"),
        ({"port": 80}, "--port"),
    ],
)
def test_bad_demo_settings(settings, message):
    with pytest.raises(UserError, match=message):
        DemoConfig(**settings)
