"""``depthprune study --executor ray --ray-address``: a tiny grid on a Ray head started outside the project.

The head is a separate ``ray start --head`` process (as a cluster would be); every cell must run as a Ray task
on it (its node id recorded in study.json), with the results in the registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from depthprune.testing.servers import free_port

pytest.importorskip("ray")


@pytest.fixture
def ray_head(tmp_path):
    """``ray start --head --num-cpus 1`` in its own temp dir; its address; stopped afterwards."""
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    port = free_port()
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    temp = Path("/tmp") / f"ray-{port}"  # Ray's socket paths must stay short
    command = [
        ray, "start", "--head", "--num-cpus", "1", "--num-gpus", "0", "--port", str(port),
        "--include-dashboard", "false", "--temp-dir", str(temp), "--disable-usage-stats",
    ]  # fmt: skip
    subprocess.run(command, check=True, env=environment, capture_output=True, timeout=180)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], env=environment, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_study_runs_every_cell_as_a_ray_task_on_an_outside_head(
    ray_head, tiny_demo_like, tmp_path, monkeypatch
):
    from registry import open_registry

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home"))
    command = [
        sys.executable, "-m", "depthprune", "study", "--model", str(tiny_demo_like), "--drop", "2",
        "--searches", "one_shot,greedy", "--samples", "4", "--seq-len", "32", "--engine", "torch",
        "--eval-seq-len", "32", "--out", str(tmp_path / "report"), "--registry", url,
        "--executor", "ray", "--ray-address", ray_head,
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    study = json.loads((tmp_path / "report" / "study.json").read_text())
    assert study["executor"] == "ray"
    cells = study["cells"]
    assert len(cells) == 4  # 2 objectives x 2 searches
    assert all(cell["ray_node_id"] and cell["host"] and cell["pid"] != os.getpid() for cell in cells)
    assert len({cell["ray_node_id"] for cell in cells}) == 1  # the one node of the outside head
    registry = open_registry(url)
    assert {variant.name for variant in registry.list_variants(str(tiny_demo_like))} >= {
        c["variant"] for c in cells
    }
