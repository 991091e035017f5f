"""The memory planner: exact parameter counts, plans of public configs on simulated GPUs, ``--dry-run``.

Plans are made from config.json alone, so these tests run on CPU in well under a second each; the real GPU
sizes are simulated with ``--gpus`` and ``--gpu-memory-gib``.
"""

from __future__ import annotations

import json

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.public_configs import public_config, public_config_dir
from ground.core.errors import UserError
from ground.planning import (
    CalibrationSizes,
    Devices,
    HealSizes,
    count_parameters,
    model_shape,
    plan_heal,
    plan_prune,
    plan_serve,
    read_model_config,
    shape_for,
)
from ground.planning.devices import GIB, auto_device_dtype, select_visible_device
from ground.planning.estimates import kv_cache_bytes

LLAMA_8B, LLAMA_70B = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"


def gpus(count: int, gib: float) -> Devices:
    return Devices("cuda", count, int(gib * GIB), simulated=True)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "mistral", "gemma3_text"])
def test_parameter_count_equals_the_models_own(architecture):
    from depthprune.testing.models import tiny_config, tiny_model

    model = tiny_model(architecture)
    expected = sum(parameter.numel() for parameter in model.parameters())
    assert count_parameters(model_shape(tiny_config(architecture).to_dict())).total == expected


@pytest.mark.parametrize(
    ("name", "published"),
    [(LLAMA_8B, 8_030_261_248), (LLAMA_70B, 70_553_706_496), ("Qwen/Qwen3-8B", 8_190_735_360)],
)
def test_public_models_count_as_published(name, published):
    assert count_parameters(model_shape(public_config(name))).total == published


def test_gemma3_text_model_counts_as_keras_publishes_it_and_the_vision_tower_is_extra():
    config = public_config("google/gemma-3-12b-it")
    # keras-hub's gemma3_12b_text preset: 11,765,788,416 parameters at a 262,144-token vocabulary.
    text = {**config["text_config"], "model_type": "gemma3_text", "vocab_size": 262144}
    assert count_parameters(model_shape(text)).total == 11_765_788_416
    shape = model_shape(config)
    assert shape.tie_word_embeddings and shape.head_dim == 256 and shape.extra_parameters > 400_000_000
    assert shape.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    # 40 of 48 blocks keep only the 1,024-token window: far less KV than if every block were full
    full = kv_cache_bytes(
        shape.__class__(**{**shape.__dict__, "layer_types": ("full_attention",) * 48}), 32768, 2
    )
    assert kv_cache_bytes(shape, 32768, 2) < full / 4


def test_pruned_config_loses_its_blocks_weights():
    config = public_config(LLAMA_8B)
    dense, pruned = (count_parameters(model_shape(c)).total for c in (config, shape_for(config, 25)))
    assert dense - pruned == 7 * count_parameters(model_shape(config)).blocks[0]


@pytest.mark.parametrize(
    ("name", "count", "gib", "fits"),
    [
        (LLAMA_8B, 1, 24, True),
        (LLAMA_8B, 1, 80, True),
        (LLAMA_70B, 1, 80, False),
        (LLAMA_70B, 4, 80, True),
        (LLAMA_70B, 8, 80, True),
        ("Qwen/Qwen3-8B", 1, 24, True),
        ("google/gemma-3-12b-it", 1, 24, False),
        ("google/gemma-3-12b-it", 1, 80, True),
    ],
)
def test_prune_plans_of_public_models(name, count, gib, fits):
    plan = plan_prune(public_config(name), name, "bfloat16", gpus(count, gib), CalibrationSizes())
    assert plan.fits == fits
    assert plan.peak_bytes >= plan.weights_bytes / count
    if not fits:
        assert plan.advice[0].startswith("use --gpus ") and "device_map" in plan.advice[0]
        more = int(plan.advice[0].split()[2])
        assert plan_prune(public_config(name), name, "bfloat16", gpus(more, gib), CalibrationSizes()).fits


def test_a_small_card_gets_a_smaller_calibration_batch_and_kl_is_chunked():
    sizes = CalibrationSizes(keeps_dense_reference=True, searches=("cbo",))
    small = plan_prune(public_config(LLAMA_8B), "m", "bfloat16", gpus(1, 40), sizes)
    large = plan_prune(public_config(LLAMA_8B), "m", "bfloat16", gpus(2, 80), sizes)
    assert small.choices["calibration_batch"] < large.choices["calibration_batch"] <= 8
    assert small.choices["kl_reference"] == "chunked"
    assert any("62.6 GiB" in line for line in small.advice)  # 64 x 2048 x 128k fp32 log-probs


def test_full_distillation_in_fp32_does_not_fit_and_lora_is_suggested():
    config = public_config(LLAMA_8B)
    student = shape_for(config, 25)
    full = HealSizes(method="distill", full_finetune=True)
    plan = plan_heal(student, config, "v", "float32", gpus(1, 80), full)
    assert not plan.fits and any("LoRA" in line for line in plan.advice)
    assert plan_heal(student, config, "v", "bfloat16", gpus(1, 80), HealSizes()).fits


def test_serve_picks_a_context_and_shares_that_fit_three_variants_on_one_card():
    config = public_config(LLAMA_8B)
    engines = [("dense", config, 1), ("m7-a", shape_for(config, 25), 1), ("m7-b", shape_for(config, 25), 1)]
    plan = plan_serve(engines, "bfloat16", gpus(1, 80))
    assert plan.fits and plan.choices["max_model_len"] < 131072
    shares = [engine["gpu_memory_utilization"] for engine in plan.choices["engines"]]
    assert sum(shares) < 1 and all(share > 0.2 for share in shares)
    assert not plan_serve(engines, "bfloat16", gpus(1, 24)).fits


def engine_cards(plan) -> dict[tuple[str, int], set[int]]:
    return {(e["variant"], e["replica"]): set(e["gpus"]) for e in plan.choices["engines"]}


def shares_per_card(plan) -> dict[int, float]:
    totals: dict[int, float] = {}
    for engine in plan.choices["engines"]:
        for card in engine["gpus"]:
            totals[card] = totals.get(card, 0) + engine["gpu_memory_utilization"]
    return totals


def test_serve_replicas_get_cards_of_their_own_and_each_card_s_shares_stay_below_one():
    config = public_config(LLAMA_8B)
    variants = [("dense", config), ("m7-a", shape_for(config, 25)), ("m7-b", shape_for(config, 25))]
    on_one = plan_serve([(name, c, 1) for name, c in variants for _ in range(2)], "bfloat16", gpus(1, 80))
    assert not on_one.fits and "dense: 2 replica(s) x tensor parallel 1 need 2 GPUs" in on_one.one_line()
    assert on_one.advice[0] == "use --gpus 2 (more cards for the engines)"
    assert "fewer --replicas" in on_one.advice[-1]
    engines = [(name, c, 2) for name, c in variants for _ in range(2)]
    assert plan_serve(engines, "bfloat16", gpus(2, 80)).advice[0].startswith("use --gpus 4")
    plan = plan_serve(engines, "bfloat16", gpus(8, 80))
    cards = engine_cards(plan)
    assert plan.fits and list(cards) == [(name, replica) for name, _ in variants for replica in (0, 1)]
    assert all(len(used) == 2 for used in cards.values())
    assert all(not cards[name, 0] & cards[name, 1] for name, _ in variants)  # replicas never share a card
    totals = shares_per_card(plan)
    assert sorted(totals) == list(range(8)) and all(0.5 < total < 1 for total in totals.values())


def test_serve_engines_too_large_to_share_a_card_get_disjoint_cards():
    config = public_config(LLAMA_70B)
    engines = [("dense", config, 2), ("dense", config, 2), ("m9", shape_for(config, 71), 2)]
    # 66 GiB of weights per card and engine: m9 cannot join a dense replica's cards on 4 GPUs.
    assert not plan_serve(engines, "bfloat16", gpus(4, 80)).fits
    plan = plan_serve(engines, "bfloat16", gpus(6, 80))
    cards = list(engine_cards(plan).values())
    assert plan.fits and set().union(*cards) == set(range(6)) and sum(map(len, cards)) == 6
    assert all(share == 0.9 for share in shares_per_card(plan).values())


def test_serve_sizing_gives_each_replica_its_cards_share_and_port(tmp_path):
    from server import BackendPool, BackendSpec, GatewaySettings, VllmOptions
    from server.sizing import SizingRequest, size_engines

    directory = str(public_config_dir(LLAMA_8B, tmp_path))
    settings = GatewaySettings(
        backends=[BackendSpec("dense", model_dir=directory), BackendSpec("far", url="http://127.0.0.1:9")],
        vllm=VllmOptions(first_port=21000),
    )
    request = SizingRequest(gpus=4, gpu_memory_gib=80, tensor_parallel="2", replicas="dense=2")
    pool = BackendPool(size_engines(settings, request, gpu_build=False))
    first, second = pool.variants["dense"].replicas
    assert [first.port, second.port, pool["far"].port] == [21000, 21001, None]
    visible = [set(replica.environment()["CUDA_VISIBLE_DEVICES"].split(",")) for replica in (first, second)]
    assert visible == [{"0", "1"}, {"2", "3"}]
    command = first.command()
    assert command[command.index("--tensor-parallel-size") + 1] == "2"
    assert 0 < float(command[command.index("--gpu-memory-utilization") + 1]) < 1
    with pytest.raises(UserError, match="--replicas names 'nope'"):
        size_engines(settings, SizingRequest(gpus=4, replicas="nope=2"), gpu_build=False)
    with pytest.raises(UserError, match="dense: 2 replica"):  # refused before any process starts
        size_engines(settings, SizingRequest(gpus=1, replicas="2"), gpu_build=False)


def test_config_sources_and_bad_input(tmp_path):
    directory = public_config_dir(LLAMA_8B, tmp_path)
    assert (
        read_model_config(directory)
        == read_model_config(directory / "config.json")
        == public_config(LLAMA_8B)
    )
    with pytest.raises(UserError, match="lacks"):
        model_shape({"model_type": "llama"})
    assert auto_device_dtype("auto", "auto", gpus=2) == ("cuda", "bfloat16")
    assert auto_device_dtype("cpu", "auto") == ("cpu", "float32")
    with pytest.raises(UserError, match="unknown device"):
        auto_device_dtype("gpu0", "auto")


def test_cuda_n_shows_vllm_only_that_card(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    select_visible_device("cuda:1")
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    with pytest.raises(UserError, match="shows 1 card"):
        select_visible_device("cuda:1")


@pytest.mark.parametrize(("name", "count", "code"), [(LLAMA_8B, 1, 0), (LLAMA_70B, 1, 3), (LLAMA_70B, 4, 0)])
def test_prune_dry_run_json_acceptance(tmp_path, name, count, code):
    model = public_config_dir(name, tmp_path)
    status, out, err = run_cli(
        "prune", "--model", model, "--objective", "perplexity", "--data", "c4", "--drop", "7",
        "--dry-run", "--json", "--gpus", count, "--gpu-memory-gib", 80,
    )  # fmt: skip
    assert status == code, err
    plan = json.loads(out)
    assert plan["dtype"] == "bfloat16" and plan["fits"] == (code == 0)
    assert {"weights_bytes", "peak_bytes", "fits", "advice"} <= set(plan)
    if name == LLAMA_8B:
        assert abs(plan["weights_bytes"] / (8.03e9 * 2) - 1) < 0.03
    if code:
        assert "--gpus" in plan["advice"][0] and "device_map" in plan["advice"][0]


def test_study_and_heal_dry_runs_print_a_table_and_a_simulated_run_is_refused(tmp_path):
    model = public_config_dir("Qwen/Qwen3-8B", tmp_path)
    status, out, _ = run_cli(
        "study", "--model", model, "--drop", "4", "--dry-run", "--gpus", 1, "--gpu-memory-gib", 48,
    )  # fmt: skip
    assert status == 0 and "eval_gpu_memory_utilization: 0.85" in out and "fits" in out
    status, _, err = run_cli(
        "prune", "--model", model, "--objective", "perplexity", "--data", "c4", "--drop", "2", "--gpus", 1,
    )  # fmt: skip
    assert status == 2 and "not this machine" in err


def test_study_workers_sharing_a_card_plan_for_their_share(tmp_path):
    """``study --worker --workers-per-gpu N``: each worker plans its cells for 1/N of the card; when the
    share is too small the advice is the most workers per card that fit; bad uses are one line."""
    model = public_config_dir("meta-llama/Llama-3.1-8B", tmp_path)
    common = [
        "study", "--model", model, "--drop", "4", "--dry-run", "--gpus", 1, "--gpu-memory-gib", 80,
        "--worker", "--engine", "torch", "--json",
    ]  # fmt: skip

    def plan(workers: int) -> tuple[int, dict]:
        status, out, _ = run_cli(*common, "--workers-per-gpu", workers)
        return status, json.loads(out)

    (alone_status, alone), (two_status, two), (six_status, six) = plan(1), plan(2), plan(6)
    assert alone_status == two_status == 0 and six_status == 3
    assert two["devices"]["memory_bytes"] == alone["devices"]["memory_bytes"] // 2
    assert two["devices"]["sharers"] == 2 and two["peak_bytes"] <= two["devices"]["usable_bytes"]
    assert two["choices"]["memory_budget_gb"] < alone["choices"]["memory_budget_gb"]  # a smaller cache
    assert six["advice"][0] == "run at most 2 worker(s) per card (--workers-per-gpu 2)"
    status, out, _ = run_cli(*common[:-1], "--workers-per-gpu", 6)
    assert status == 3 and "a 1/6 share of a 80 GiB card" in " ".join(out.split())
    for extra, message in (
        (["--workers-per-gpu", "0"], "--workers-per-gpu must be a positive integer, got 0"),
        (["--workers-per-gpu", "2", "--engine", "vllm"], "--workers-per-gpu 2 needs --engine torch"),
    ):
        status, _, err = run_cli(*common, *extra)
        assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli(*[arg for arg in common if arg != "--worker"], "--workers-per-gpu", 2)
    assert status == 2 and "add --worker" in err


def test_task_margin_sums_without_atomics_match_index_add():
    import torch

    from pruning.calibration.objectives.batches import one_hot_sum, sum_by_index

    generator = torch.Generator().manual_seed(0)
    values = torch.randn(500, generator=generator, dtype=torch.float64)
    index = torch.randint(0, 37, (500,), generator=generator)
    assert torch.allclose(one_hot_sum(values, index, 37), sum_by_index(values, index, 37), atol=1e-12)
    assert torch.equal(one_hot_sum(values, index, 37), one_hot_sum(values, index, 37))


def test_serve_dry_run_sizes_three_llama_engines_on_one_card(tmp_path):
    from depthprune.testing.variants import fake_checkpoint, register_example_base, register_example_variant
    from registry import open_registry

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = open_registry(url)
    from ground.core.checksums import weights_sha256

    base = fake_checkpoint(public_config_dir(LLAMA_8B, tmp_path))
    register_example_base(registry, str(base), num_blocks=32, weights_sha256=weights_sha256(base))
    for name, removed in (("m7-a", range(20, 27)), ("m7-b", range(22, 29))):
        checkpoint = fake_checkpoint(tmp_path / name, name.encode())
        (checkpoint / "config.json").write_text(json.dumps(shape_for(public_config(LLAMA_8B), 25)))
        register_example_variant(
            registry, list(removed), base_model=str(base), checkpoint=checkpoint, alias=name
        )
    variants = "dense,m7-a,m7-b"
    args = ("serve", "--variants", variants, "--registry", url, "--dry-run", "--json", "--gpu-memory-gib", 80)
    status, out, err = run_cli(*args, "--gpus", 1)
    assert status == 0, err
    plan = json.loads(out)
    assert plan["choices"]["max_model_len"] < 131072
    assert sum(engine["gpu_memory_utilization"] for engine in plan["choices"]["engines"]) < 1
    status, out, _ = run_cli(*args, "--gpus", 2, "--tensor-parallel", "dense=2")
    dense = next(engine for engine in json.loads(out)["choices"]["engines"] if engine["variant"] == "dense")
    assert status == 0 and dense["tensor_parallel_size"] == 2 and dense["gpus"] == [0, 1]
    status, out, _ = run_cli(*args, "--gpus", 2, "--replicas", "dense=2")
    dense = [engine for engine in json.loads(out)["choices"]["engines"] if engine["variant"] == "dense"]
    assert status == 0 and [(engine["replica"], engine["gpus"]) for engine in dense] == [(0, [0]), (1, [1])]
    status, out, _ = run_cli(*args, "--gpus", 1, "--replicas", "2")
    plan = json.loads(out)
    assert status == 3 and not plan["fits"] and plan["advice"][0].startswith("use --gpus 2")
    assert plan["shortfalls"][0].startswith("dense: 2 replica(s) x tensor parallel 1 need 2 GPUs")
    status, _, _ = run_cli(
        "serve", "--variants", variants, "--registry", url, "--dry-run", "--gpu-memory-gib", 24
    )
    assert status == 3


def test_eval_dry_run_plans_the_engine_without_registering_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home"))
    model = public_config_dir(LLAMA_70B, tmp_path)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    status, out, err = run_cli(
        "eval", model, "--registry", url, "--dry-run", "--gpus", 1, "--gpu-memory-gib", 80
    )
    assert status == 3 and "tensor parallel" in out, err
    status, _, _ = run_cli("eval", model, "--registry", url, "--dry-run", "--gpus", 4, "--gpu-memory-gib", 80)
    assert status == 0
    from registry import open_registry

    assert open_registry(url).base_models() == []


def test_the_planner_mirrors_the_evaluators_head_chunks_and_search_widths():
    from ground.planning import estimates
    from pruning.calibration.objectives import batches
    from pruning.evaluation import packed_scoring
    from pruning.search import MODULES
    from pruning.search.beam import Options

    assert estimates.CALIBRATION_HEAD_CHUNK == batches.HEAD_CHUNK_POSITIONS
    assert estimates.EVALUATION_HEAD_CHUNK == packed_scoring.HEAD_CHUNK_POSITIONS
    assert estimates.BASE_WIDTH["beam"] == Options().width
    assert set(estimates.BASE_WIDTH) | estimates.SET_SCORING <= set(MODULES)


def test_calibration_activations_count_one_head_chunk_and_search_states_their_paths():
    """The loss holds one sequence's logits at once (perplexity runs the head row by row), the trie walk one
    state per block of one batch, and greedy's states beyond the dense cache are one path of N - 1
    boundaries."""
    from ground.planning.estimates import search_state_paths

    sizes = CalibrationSizes(
        samples=16, seq_len=2048, searches=("one_shot", "greedy"), shared_evaluator=False
    )
    plan = plan_prune(public_config(LLAMA_8B), "m", "bfloat16", gpus(1, 140), sizes)
    items = {item.name: item.bytes for item in plan.steps[0].items}
    assert items["activations (batch 8)"] == 2048 * 128256 * (2 + 4 + 4)
    assert items["trie path (<= 32 states of one batch)"] == 32 * 8 * 2048 * 4096 * 2
    assert items["search states (1 path(s) of 31 boundaries)"] == 31 * 16 * 2048 * 4096 * 2
    assert search_state_paths(("one_shot", "greedy", "beam"), shared=True) == 5 + 3  # beam's bases, 3 finals
    assert search_state_paths(("greedy", "beam"), shared=False) == 5
    assert search_state_paths(("greedy", "evolution"), shared=False) is None
    filling = plan_prune(
        public_config(LLAMA_8B), "m", "bfloat16", gpus(1, 80), CalibrationSizes(searches=("evolution",))
    )
    assert filling.fits and filling.peak_bytes == pytest.approx(filling.devices.usable_bytes, rel=0.01)


@pytest.mark.parametrize("measured", ["planner-llama-3.1-8b-16x2048.json", "planner-qwen3-8b-4x2048.json"])
def test_the_plan_is_within_five_percent_of_the_peak_measured_on_an_h200(measured):
    """docs/gpu-results: ``benchmarks.gpu_scale`` on one H200 (random bf16 weights, one_shot and greedy at
    M = 7, each on a fresh evaluator); the plan of the same run on a card of that size."""
    from pathlib import Path

    result = json.loads((Path(__file__).parents[1] / "docs" / "gpu-results" / measured).read_text())
    (point,) = {entry["samples"] for entry in result["searches"].values()}
    sizes = CalibrationSizes(
        samples=point, seq_len=2048, searches=("one_shot", "greedy"), shared_evaluator=False
    )
    h200 = Devices("cuda", 1, 143771 * 2**20, simulated=True)
    plan = plan_prune(public_config(result["model"]), "m", "bfloat16", h200, sizes)
    assert plan.peak_bytes / GIB == pytest.approx(result["peak_gib_measured"], rel=0.05)
