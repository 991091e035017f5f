"""``python -m benchmarks.gpu_scale --smoke``: the 8B GPU measurement's whole path on a tiny shape on the CPU,
so the script cannot rot between GPU leases."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_scale


def test_the_smoke_run_times_both_searches_at_two_sizes_and_writes_the_result(tmp_path):
    out = tmp_path / "scale.json"
    result = gpu_scale.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["model_shape"]["num_layers"] == 6 and result["drop"] == 2
    for name in ("one_shot", "greedy"):
        search = result["searches"][name]
        assert [point["samples"] for point in search["sizes"]] == [2, 4]
        for point in search["sizes"]:
            assert point["seconds"] > 0 and point["block_forwards"] > 0 and point["tflop"] > 0
            assert len(point["removed_blocks"]) == 2
        assert search["seconds"] == search["sizes"][-1]["seconds"]
    assert result["greedy_seconds_at_paper_size"] == result["searches"]["greedy"]["seconds_at_paper_size"]
    assert result["peak_gib_planned"] >= 0 and result["peak_gib_measured"] is None  # no CUDA here


def test_the_paper_size_is_the_line_through_the_two_sizes_unless_measured():
    points = [{"samples": 8, "seconds": 10.0}, {"samples": 16, "seconds": 18.0}]
    assert gpu_scale.at_paper_size(points) == pytest.approx(10.0 + 8.0 * 56 / 8)
    assert gpu_scale.at_paper_size([*points, {"samples": 64, "seconds": 70.0}]) == 70.0
    assert gpu_scale.at_paper_size(points[:1]) is None


def test_a_smoke_run_never_overwrites_the_committed_gpu_result():
    with pytest.raises(SystemExit):
        gpu_scale.parse_args(["--smoke"])


def test_a_size_projected_past_the_budget_is_skipped_and_named(tmp_path):
    result = gpu_scale.main(["--smoke", "--out", str(tmp_path / "scale.json"), "--budget-seconds", "0"])
    assert result["skipped_samples"] == [4] and result["complete"]
    assert [point["samples"] for point in result["searches"]["greedy"]["sizes"]] == [2]
    assert result["greedy_seconds_at_paper_size"] is None  # one size gives no line


def test_the_profile_splits_an_evaluation_into_blocks_and_the_rest(tmp_path):
    out = tmp_path / "scale.json"
    profile = gpu_scale.main(["--smoke", "--out", str(out)])["profile"]
    # the tiny model has 6 blocks: 4 removals timed, one warm-up and one profiled evaluation beside them
    assert profile["blocks_run"] == [6 - k - 1 for k in profile["removed_one_at_a_time"]]
    assert len(profile["seconds"]) == 4 and profile["per_block_seconds"] > 0
    assert profile["profiled_removal"] not in profile["removed_one_at_a_time"]
    assert "aten::" in (tmp_path / profile["operator_table"]).read_text()
