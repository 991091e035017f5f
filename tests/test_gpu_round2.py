"""Issue 58's GPU benchmarks on the CPU: the fused block forward (one compiled graph shared by every block,
scores as the model's own), ``benchmarks.gpu_fused --smoke`` and ``benchmarks.gpu_mixed_depth --smoke``, so
that the one GPU run of the round cannot fail on a path nobody ran."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_fused, gpu_mixed_depth
from depthprune.testing.models import tiny_model
from ground.core.errors import UserError
from pruning.calibration.scoring.fusion import fused_blocks
from pruning.model.blocks import BlockStack


def test_one_compiled_graph_serves_every_block_and_computes_what_the_blocks_do():
    stack = BlockStack(tiny_model("llama"))
    fused = fused_blocks(stack.blocks, stack.device, "eager")
    graphs = fused.stats.graphs
    prepared = stack.prepare(torch.randint(0, stack.config.vocab_size, (2, 12)))
    with torch.no_grad():
        plain = fast = prepared.hidden
        for index in range(stack.num_blocks):
            plain = stack.blocks[index](plain, **prepared.block_kwargs[index])
            fast = fused[index](fast, **prepared.block_kwargs[index])
    torch.testing.assert_close(fast, plain, rtol=0, atol=0)
    # dynamo inlines the blocks: their parameters are graph inputs, so six blocks cost one graph
    assert fused.stats.graphs - graphs <= 1 and len(fused) == stack.num_blocks


def test_fusion_is_refused_on_the_cpu():
    stack = BlockStack(tiny_model("llama"))
    with pytest.raises(UserError, match="CUDA"):
        fused_blocks(stack.blocks, stack.device, True)


def test_the_fused_smoke_run_compares_both_searches_with_and_without_fusion(tmp_path):
    out = tmp_path / "fused.json"
    result = gpu_fused.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result)) and result["complete"]
    assert set(result["per_block"]) >= {"unfused", "fused", "speedup"}
    for label in ("unfused", "fused"):
        assert result["per_block"][label]["per_block_ms"] > 0
        assert (tmp_path / result["per_block"][label]["operator_table"]).exists()
    for search in ("one_shot", "greedy"):
        arms = result["searches"][search]
        assert len(arms["fused"]["removed_blocks"]) == 2
        # the eager backend computes exactly what the blocks do: the same choice and the same loss
        assert result["agreement"][search]["same_removal_set"]
        assert result["agreement"][search]["loss_relative_difference"] == 0
    assert result["single_block_scores"]["same_ranking"]
    assert result["compile"]["graphs"] >= 1 and result["peak_gib_measured"] is None  # no CUDA here


def test_a_fused_step_projected_past_the_budget_is_skipped_and_named(tmp_path):
    result = gpu_fused.main(["--smoke", "--out", str(tmp_path / "fused.json"), "--budget-seconds", "0"])
    assert result["skipped"] and result["complete"]


def test_a_fused_arm_that_fails_is_recorded_and_the_unfused_half_kept(tmp_path):
    # inductor is refused on the CPU, as a compile failure on the card would raise: the record keeps going
    result = gpu_fused.main(["--smoke", "--out", str(tmp_path / "fused.json"), "--backend", "inductor"])
    assert "CUDA" in result["fused_error"] and result["complete"]
    assert set(result["searches"]["greedy"]) == {"unfused"} and "fused" not in result["per_block"]


def test_the_masks_remove_a_quarter_each_and_different_blocks():
    masks = gpu_mixed_depth.masks(4, 32)
    assert all(len(mask) == 8 for mask in masks) and len(set().union(*masks)) == 32
    assert gpu_mixed_depth.masks(2, 32) == masks[:2]


def test_the_mixed_depth_smoke_run_times_every_arm_and_its_outputs_agree(tmp_path):
    out = tmp_path / "mixed.json"
    result = gpu_mixed_depth.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result)) and result["complete"]
    assert [(run["k"], run["phase"]) for run in result["runs"]] == [
        (k, phase) for phase in ("prefill", "decode") for k in (1, 2, 4)
    ]
    for run in result["runs"]:
        assert set(run["arms"]) == set(gpu_mixed_depth.ARMS)
        assert run["arms"]["separate"]["of_separate"] == 1.0
    weights = result["weights_gib"]
    assert weights["1"]["one_copy_gib"] == weights["4"]["one_copy_gib"]


def test_gathered_rows_compute_what_separate_sub_batches_compute():
    """(b) is the same function as (a): each row goes through its own mask's blocks, cache included."""
    stack = BlockStack(tiny_model("llama"))
    removed = gpu_mixed_depth.masks(2, stack.num_blocks)
    hidden = torch.randn(4, 5, stack.config.hidden_size)
    with torch.no_grad():
        outputs = {}
        for name in ("separate", "gathered"):
            arm = gpu_mixed_depth.Arm(stack, name, removed, 4, capacity=8, filled=0)
            arm.forward(hidden, 0)  # prefill writes the cache
            outputs[name] = torch.cat(arm.forward(hidden[:, -1:], 5))  # one decode step reads it
    torch.testing.assert_close(outputs["gathered"], outputs["separate"])


def test_the_run_sheet_names_one_command_whose_options_both_benchmarks_take():
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "gpu.md").read_text()
    block = text.split("**Round 2 (issue 58), one call on a GPU machine**", 1)[1]
    command = re.search(r"```bash\n(.*?)\n```", block, re.S).group(1)
    assert "\n" not in command and len(command) <= 2000
    modules = {"benchmarks.gpu_fused": gpu_fused, "benchmarks.gpu_mixed_depth": gpu_mixed_depth}
    limits = 0
    for part in command.split(";"):
        words = shlex.split(part.replace("$OUT", "/tmp/out"))
        assert words[0] == "timeout" and words[words.index("python") + 1] == "-m"
        limits += float(words[words.index("python") - 1]) + float(words[words.index("-k") + 1])
        at = words.index("-m") + 1
        args = modules.pop(words[at]).parse_args(words[at + 1 :])
        assert str(args.out).startswith("/tmp/out/") and args.budget_seconds < 250
    assert modules == {} and limits <= 420
