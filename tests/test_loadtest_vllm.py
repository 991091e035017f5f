"""A short real load test against the vLLM CPU engine serving a tiny model (one server for the session).

The server serves one tiny Llama under two names, ``dense`` and ``copy``, so the interleaved comparison
runs end to end; the load is tiny (a few requests of a few tokens).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from depthprune.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

OUTPUT_LEN = 8
NUM_PROMPTS = 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_tiny_server(tiny_model_dirs, tmp_path_factory):
    """Base URL of a vLLM OpenAI server serving the tiny Llama as ``dense`` and ``copy``."""
    model_dir = tiny_model_dirs("llama")
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-loadtest") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model_dir),
                "--served-model-name",
                "dense",
                "copy",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--dtype",
                "float32",
                "--max-model-len",
                "256",
                "--max-num-seqs",
                "16",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"vLLM did not start in 600 s:\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def run_cli(args, capsys) -> tuple[int, str, str]:
    try:
        main(["loadtest", *args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_real_comparison_against_vllm(vllm_tiny_server, tmp_path, capsys):
    result_file = tmp_path / "result.json"
    code, out, err = run_cli(
        [
            "--target",
            vllm_tiny_server,
            "--models",
            "dense,copy",
            "--num-prompts",
            str(NUM_PROMPTS),
            "--input-len",
            "16",
            "--output-len",
            str(OUTPUT_LEN),
            "--rounds",
            "2",
            "--warmup",
            "1",
            "--max-concurrency",
            "4",
            "--goodput",
            "e2el:60000",
            "--save-result",
            str(result_file),
            "--report-dir",
            str(tmp_path / "report"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    result = json.loads(out)
    assert json.loads(result_file.read_text())["models"].keys() == {"dense", "copy"}
    # The tiny model's word-level tokenizer is found through the server's root directory.
    assert result["tokenizer"].startswith("transformers AutoTokenizer")
    for model in ("dense", "copy"):
        metrics = result["models"][model]
        assert metrics["completed"] == 2 * NUM_PROMPTS and metrics["failed"] == 0, metrics["errors"]
        # ignore_eos: every request generated exactly OUTPUT_LEN tokens; prompts were cut to 16 tokens.
        assert metrics["total_output_tokens"] == 2 * NUM_PROMPTS * OUTPUT_LEN
        assert metrics["total_input_tokens"] <= 2 * NUM_PROMPTS * 17
        assert 0 < metrics["mean_ttft_ms"] < metrics["mean_e2el_ms"]
        assert metrics["mean_tpot_ms"] > 0 and metrics["p99_itl_ms"] >= metrics["median_itl_ms"] > 0
        assert metrics["max_concurrent_requests"] <= 4
        assert metrics["request_goodput"] == pytest.approx(metrics["request_throughput"])
        assert len(metrics["rounds"]) == 2
        # Same config.json for both names: N=6, nothing removed, so the ideal speedup is 1.
        assert metrics["blocks"] == {"num_blocks": 6, "removed_blocks": 0, "source": "config.json"}
    comparison = result["comparison"]["copy"]
    assert comparison["ideal_speedup"] == 1.0
    assert 0.3 < comparison["output_throughput_speedup"] < 3.0  # the same model; loose for a busy 2-core box
    assert comparison["fraction_of_ideal_speedup"] == pytest.approx(comparison["output_throughput_speedup"])
    for key in (
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_e2el_ms",
        "p90_e2el_ms",
    ):
        assert key in result["models"]["dense"]
    assert {p.rsplit("/", 1)[1] for p in result["report_files"]} == {
        "loadtest.md",
        "latency_percentiles.png",
        "throughput.png",
    }


def test_real_sweep_stops_by_itself(vllm_tiny_server, capsys):
    code, out, err = run_cli(
        [
            "--target",
            vllm_tiny_server,
            "--models",
            "dense",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--warmup",
            "1",
            "--sweep",
            "--sweep-steps",
            "3",
            "--json",
            "--no-save-registry",
        ],
        capsys,
    )
    assert code == 0, err
    result = json.loads(out)
    assert 1 <= len(result["sweep"]) <= 3 and result["sweep_stop_reason"]
    rates = [step["offered_rate"] for step in result["sweep"]]
    assert rates == sorted(rates) and all(b == pytest.approx(2 * a) for a, b in zip(rates, rates[1:]))


def test_unknown_model_is_one_line(vllm_tiny_server, capsys):
    code, _, err = run_cli(["--target", vllm_tiny_server, "--models", "dense,nope"], capsys)
    assert code == 2
    assert err == f"error: {vllm_tiny_server} does not serve 'nope'; it serves: copy, dense\n"


@pytest.fixture(scope="session")
def gateway(vllm_tiny_server, tmp_path_factory):
    """The depthprune gateway in front of the vLLM server, serving it as ``dense`` and ``copy``."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("gateway-loadtest") / "gateway.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "depthprune",
                "serve",
                "--variants",
                f"dense={vllm_tiny_server},copy={vllm_tiny_server}",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"gateway exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"gateway not ready in 120 s:\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_real_run_through_the_gateway(gateway, capsys):
    code, out, err = run_cli(
        [
            "--target",
            gateway,
            "--models",
            "dense,copy",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            str(OUTPUT_LEN),
            "--warmup",
            "1",
            "--rate",
            "20",
            "--burstiness",
            "0.5",
            "--blocks",
            "dense=6:0,copy=6:2",
            "--json",
            "--no-save-registry",
        ],
        capsys,
    )
    assert code == 0, err
    result = json.loads(out)
    for model in ("dense", "copy"):
        assert result["models"][model]["completed"] == 4, result["models"][model]["errors"]
        assert result["models"][model]["total_output_tokens"] == 4 * OUTPUT_LEN
    comparison = result["comparison"]["copy"]
    assert comparison["ideal_speedup"] == pytest.approx(1.5) and comparison["blocks_source"] == "--blocks"
    assert comparison["fraction_of_ideal_speedup"] == pytest.approx(
        comparison["output_throughput_speedup"] / 1.5
    )
