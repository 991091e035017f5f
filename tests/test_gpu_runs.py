"""What a run on several GPUs is given, checked without a GPU: vLLM's tensor-parallel size from the plan,
study cells sized by the same planner as ``prune``, and ``--gpus N`` refused where N cards are not present.
"""

from __future__ import annotations

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.public_configs import public_config, public_config_dir
from ground.core.errors import UserError
from ground.planning import Devices, plan_eval, plan_prune
from ground.planning.commands import CalibrationSizes
from ground.planning.devices import GIB

LLAMA_8B, LLAMA_70B = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"


def gpus(count: int, gib: float) -> Devices:
    return Devices("cuda", count, int(gib * GIB), simulated=True)


def test_vllm_engine_arguments_carry_the_tensor_parallel_size():
    from pruning.evaluation.engines import vllm_engine_args

    args = vllm_engine_args("m", "bfloat16", 4097, on_gpu=True, tensor_parallel_size=4)
    assert args["tensor_parallel_size"] == 4 and args["gpu_memory_utilization"] == 0.85
    assert args["enforce_eager"] is False and args["max_model_len"] == 4097
    cpu = vllm_engine_args("m", "float32", 257, on_gpu=False)
    assert cpu["tensor_parallel_size"] == 1 and cpu["gpu_memory_utilization"] == 0.3 and cpu["enforce_eager"]
    with pytest.raises(UserError, match="needs CUDA"):
        vllm_engine_args("m", "float32", 257, on_gpu=False, tensor_parallel_size=2)


def test_open_engine_passes_the_planned_cards_to_either_engine(monkeypatch, tmp_path):
    import pruning.evaluation.engines as engines

    opened, selected = [], []
    monkeypatch.setattr(engines, "resolve_engine", lambda engine: engine)
    monkeypatch.setattr(engines, "VllmEngine", lambda model, **kwargs: opened.append(("vllm", kwargs)))
    monkeypatch.setattr(engines, "TorchEngine", lambda model, **kwargs: opened.append(("torch", kwargs)))
    import ground.planning.devices as devices

    monkeypatch.setattr(devices, "select_visible_device", selected.append)
    engines.open_engine(str(tmp_path), "vllm", device="cuda:1", gpus=4)
    engines.open_engine(str(tmp_path), "vllm", device="cuda:1")
    engines.open_engine(str(tmp_path), "torch", device="cuda:2", gpus=2)
    assert opened[0] == ("vllm", {"dtype": "float32", "max_length": None, "tensor_parallel_size": 4})
    assert opened[1][1]["tensor_parallel_size"] == 1
    assert opened[2] == ("torch", {"dtype": "float32", "device": "cuda:2", "max_length": None, "gpus": 2})
    # One card is shown to vLLM alone; a tensor-parallel engine keeps every visible card.
    assert selected == ["cuda:1"]


def test_eval_gpus_follow_the_plans_tensor_parallel_choice():
    from pruning.runtime.plans import eval_gpus

    large = plan_eval(public_config(LLAMA_70B), "m", "bfloat16", gpus(8, 80), "vllm", 2048)
    small = plan_eval(public_config(LLAMA_8B), "m", "bfloat16", gpus(8, 80), "vllm", 2048)
    torch_engine = plan_eval(public_config(LLAMA_70B), "m", "bfloat16", gpus(4, 80), "torch", 2048)
    assert eval_gpus(large) == large.choices["eval_tensor_parallel_size"] > 1
    assert eval_gpus(small) == 1
    assert eval_gpus(torch_engine) == 4 and eval_gpus(None) == 1


def test_study_cells_take_the_planners_batch_like_prune(tmp_path):
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig
    from pruning.runtime.plans import planned_for_device

    model = public_config_dir(LLAMA_8B, tmp_path)
    calibration = CalibrationConfig("perplexity", "c4", samples=64, seq_len=2048)
    cell = PruneConfig(str(model), calibration, 7, ("greedy",), dtype="bfloat16", device="cuda")
    small, large = (planned_for_device(cell, gpus(1, gib)) for gib in (24, 80))
    sizes = CalibrationSizes(samples=64, seq_len=2048, searches=("greedy",))
    for sized, gib in ((small, 24), (large, 80)):
        plan = plan_prune(public_config(LLAMA_8B), "m", "bfloat16", gpus(1, gib), sizes)
        assert sized.calibration_batch == plan.choices["calibration_batch"]
        assert sized.memory_budget_gb == plan.choices["memory_budget_gb"] and sized.gpus == 1
    assert small.calibration_batch < large.calibration_batch
    assert small.memory_budget_gb < large.memory_budget_gb
    # On the CPU a cell keeps its sizes (host memory is shared with everything else).
    assert planned_for_device(PruneConfig(str(model), calibration, 7, ("greedy",))).calibration_batch == 8


def test_several_gpus_are_refused_where_fewer_are_visible(tmp_path, monkeypatch):
    import pruning.runtime.plans as run_planning

    model = public_config_dir(LLAMA_70B, tmp_path)
    args = ["prune", "--model", model, "--objective", "perplexity", "--data", "c4", "--drop", "2"]
    status, _, err = run_cli(*args, "--gpus", 4)  # no GPU here: a plan for another machine
    assert status == 2 and "not this machine" in err and len(err.strip().splitlines()) == 1
    # One real 80 GiB card and --gpus 4: the plan is for cards this machine lacks.
    monkeypatch.setattr(run_planning, "gpu_memory_bytes", lambda: [80 * GIB])
    monkeypatch.setattr("ground.planning.devices.gpu_memory_bytes", lambda: [80 * GIB])
    status, _, err = run_cli(*args, "--gpus", 4)
    assert status == 2 and "1 GPU(s) are visible" in err and len(err.strip().splitlines()) == 1


def test_a_study_cell_runs_prune_on_the_studys_cards():
    from pruning.calibration.config import CalibrationConfig
    from pruning.study.plan import Cell, StudyConfig, cell_prune_config

    study = StudyConfig(
        model="m", drops=(2,), objectives=("perplexity",), searches=("greedy", "one_shot"), data=("c4",),
        seeds=(0,), device="cuda:1", gpus=2,
    )  # fmt: skip
    cell = Cell(CalibrationConfig("perplexity", "c4"), 2, "one_shot", 3, "random", "standalone", ())
    config = cell_prune_config(study, "m", cell, ("one_shot",), progress=False)
    assert (config.device, config.gpus, config.drop, config.seed) == ("cuda:1", 2, 2, 3)
    assert config.random_prior and config.searches == ("one_shot",)


def test_the_plan_keeps_the_dense_reference_of_any_objective_with_a_kl_weight(tmp_path):
    """The planner reads the objective's facts, not its name: ``task_ce --kl-weight`` keeps the KL reference
    like ``kl`` does, ``task_ce`` alone does not."""
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig
    from pruning.runtime.plans import _calibration_sizes

    model = str(public_config_dir(LLAMA_8B, tmp_path))

    def plan_of(calibration):
        sizes = _calibration_sizes(PruneConfig(model, calibration, 7, ("greedy",)), ("greedy",))
        return plan_prune(public_config(LLAMA_8B), "m", "bfloat16", gpus(1, 80), sizes)

    with_kl = plan_of(CalibrationConfig("task_ce", "commonsense170k", kl_weight=0.5))
    plain = plan_of(CalibrationConfig("task_ce", "commonsense170k"))
    kl = plan_of(CalibrationConfig("kl", "c4"))
    assert "kl_reference" in with_kl.choices and "kl_reference" in kl.choices
    assert "kl_reference" not in plain.choices
