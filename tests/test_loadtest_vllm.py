"""A short real load test against the vLLM CPU engine serving a tiny model (one server for the session).

The server (``vllm_tiny_server`` in conftest.py, shared with test_experiments.py) serves one tiny Llama under
several names; the load test compares ``dense`` and ``copy``, so the interleaved comparison runs end to end;
the load is tiny (a few requests of a few tokens).
"""

from __future__ import annotations

import json

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.servers import running_gateway

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

OUTPUT_LEN = 8
NUM_PROMPTS = 6


def test_real_comparison_against_vllm(vllm_tiny_server, tmp_path):
    result_file = tmp_path / "result.json"
    code, out, err = run_cli(
        "loadtest",
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
        "--max-rounds",
        "2",
        "--aa",
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
    )
    assert code == 0, err
    result = json.loads(out)
    assert json.loads(result_file.read_text())["models"].keys() == {"dense", "copy", "dense (A/A)"}
    # The tiny model's word-level tokenizer is found through the server's root directory.
    assert result["tokenizer"].startswith("transformers AutoTokenizer")
    for model in ("dense", "copy", "dense (A/A)"):
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
    assert comparison["ideal_speedup"] == 1.0 and result["rounds"] == 2
    low, high = comparison["output_throughput_speedup_ci95"]
    assert low <= comparison["output_throughput_speedup"] <= high
    assert result["aa"]["output_throughput_ratio_ci95"] and result["aa"]["mean_tpot_ms_ratio_ci95"]
    # The steady-state phase: a Poisson rate below the saturation one, with TTFT and TPOT ratios of its own.
    steady = result["steady"]
    assert 0 < steady["rate"] < result["models"]["dense"]["request_throughput"]
    assert steady["comparison"]["copy"]["ratios_ci95"]["mean_tpot_ms"] and steady["rounds"] == 2
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


def test_real_sweep_stops_by_itself(vllm_tiny_server):
    code, out, err = run_cli(
        "loadtest",
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
        "--rounds",
        "1",
        "--sweep",
        "--sweep-steps",
        "3",
        "--json",
        "--no-save-registry",
    )
    assert code == 0, err
    result = json.loads(out)
    assert 1 <= len(result["sweep"]) <= 3 and result["sweep_stop_reason"]
    rates = [step["offered_rate"] for step in result["sweep"]]
    assert rates == sorted(rates) and all(b == pytest.approx(2 * a) for a, b in zip(rates, rates[1:]))


def test_unknown_model_is_one_line(vllm_tiny_server):
    code, _, err = run_cli("loadtest", "--target", vllm_tiny_server, "--models", "dense,nope")
    assert code == 2
    assert err == f"error: {vllm_tiny_server} does not serve 'nope'; it serves: copy, dense, twin\n"


@pytest.fixture(scope="session")
def gateway(vllm_tiny_server, tmp_path_factory):
    """The depthprune gateway in front of the vLLM server, serving it as ``dense`` and ``copy``."""
    log = tmp_path_factory.mktemp("gateway-loadtest") / "gateway.log"
    with running_gateway(f"dense={vllm_tiny_server},copy={vllm_tiny_server}", log) as started:
        yield started.url


def test_real_run_through_the_gateway(gateway):
    code, out, err = run_cli(
        "loadtest",
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
        "--rounds",
        "1",
        "--max-rounds",
        "1",
        "--rate",
        "20",
        "--burstiness",
        "0.5",
        "--blocks",
        "dense=6:0,copy=6:2",
        "--json",
        "--no-save-registry",
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


def test_real_capacity_search_is_short_and_complete(vllm_tiny_server):
    """``--slo`` against the real engine: one replicate at a loose objective, within a short budget."""
    code, out, err = run_cli(
        "loadtest", "--target", vllm_tiny_server, "--models", "dense,copy", "--aa", "--slo",
        "ttft_p99_ms=5000,tpot_p99_ms=2000", "--slo-replicates", "1", "--num-prompts", "8",
        "--input-len", "8", "--output-len", "4", "--warmup", "1", "--time-budget", "40", "--json",
        "--no-save-registry",
    )  # fmt: skip
    assert code == 0, err
    capacity = json.loads(out)["capacity"]
    assert set(capacity["arms"]) == {"dense", "copy", "dense (A/A)"}
    for entry in capacity["arms"].values():
        low, high = entry["capacity_rps_ci95"]
        assert low <= entry["capacity_rps"] <= high
    assert all(step["requested_rps"] > 0 and "achieved_rps" in step for step in capacity["steps"])
