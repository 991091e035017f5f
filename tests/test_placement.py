"""Multi-GPU placement (``--gpus N``): the device_map of public models, simulated on the meta device, and the
spread code path of pruning run on the CPU.

No GPU is needed: the public configs (Llama-3.1-8B/70B, Qwen3-8B, Gemma-3-12B's text model) are built on the
meta device (no weights) to check the map against the real module tree; a tiny real model is pruned through
the device_map loading path with every block's inputs moved to "its card", and must give the same scores
and byte-identical checkpoint files as the plain path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from depthprune.testing.public_configs import PUBLIC_MODELS, public_config
from ground.planning import Devices, count_parameters, model_shape
from ground.planning.devices import GIB
from ground.planning.estimates import weights_on_fullest_device
from ground.planning.placement import place_blocks

BF16 = 2


def transformers_config(name: str):
    """The transformers config of a public model's language model (Gemma-3's text half, what is pruned)."""
    from transformers import AutoConfig

    config = public_config(name)
    if "text_config" in config:
        config = {
            **config["text_config"],
            "model_type": config["text_config"].get("model_type", "gemma3_text"),
        }
    config = {key: value for key, value in config.items() if key not in ("architectures",)}
    return AutoConfig.for_model(**config)


def meta_model(config):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config)


def owner(name: str, mapping: dict[str, str]) -> list[str]:
    """The map entries a parameter or buffer name lies under."""
    return [key for key in mapping if name == key or name.startswith(key + ".")]


@pytest.mark.parametrize("cards", [4, 8])
@pytest.mark.parametrize("name", list(PUBLIC_MODELS))
def test_device_map_of_public_models_places_every_block_once_within_each_card(name, cards):
    from pruning.model.placement import device_map

    config = transformers_config(name)
    devices = [f"cuda:{index}" for index in range(cards)]
    mapping = device_map(config, devices)
    model = meta_model(config)

    loads = dict.fromkeys(devices, 0)
    parameters = dict(model.named_parameters())  # a tied head's weight is listed (and stored) once
    for tensor_name, tensor in [*parameters.items(), *model.named_buffers()]:
        (key,) = owner(tensor_name, mapping)  # exactly one entry holds it
        if tensor_name in parameters:
            loads[mapping[key]] += tensor.numel() * BF16
    for index in range(config.num_hidden_layers):
        assert f"model.layers.{index}" in mapping
    block_cards = [int(mapping[f"model.layers.{i}"].split(":")[1]) for i in range(config.num_hidden_layers)]
    assert block_cards == sorted(block_cards)  # contiguous runs: activations cross each card once
    assert mapping["model.embed_tokens"] == "cuda:0"
    tied = config.tie_word_embeddings
    assert mapping["lm_head"] == mapping["model.norm"] == ("cuda:0" if tied else devices[-1])

    usable = Devices("cuda", cards, int(80 * GIB), simulated=True).usable_bytes
    assert max(loads.values()) <= usable
    # The planner's estimate is this placement, counted from config.json alone.
    count = count_parameters(model_shape(public_config(name)))
    planned = place_blocks(count, cards, tied)
    if "text_config" not in public_config(name):  # Gemma-3's count also holds its vision tower
        assert [loads[device] for device in devices] == [p * BF16 for p in planned.device_parameters]
        assert weights_on_fullest_device(count, BF16, cards) == max(loads.values())


def test_seventy_billion_on_four_cards_is_balanced():
    count = count_parameters(model_shape(public_config("meta-llama/Llama-3.1-70B")))
    placement = place_blocks(count, 4, tied=False)
    assert placement.devices == 4 and len(placement.block_devices) == 80
    # No card carries much more than a quarter of the weights.
    assert max(placement.device_parameters) < 1.05 * count.total / 4
    assert sum(placement.device_parameters) == count.total


def test_spread_devices_are_consecutive_cards_and_need_cuda():
    from ground.core.errors import UserError
    from pruning.model.placement import spread_devices

    assert spread_devices("cuda:2", 3) == ["cuda:2", "cuda:3", "cuda:4"]
    assert spread_devices("cuda", 2) == ["cuda:0", "cuda:1"]
    assert spread_devices("cpu", 1) == ["cpu"]
    with pytest.raises(UserError, match="CUDA"):
        spread_devices("cpu", 2)


def _prune(model_dir: Path, out: Path, text: Path, gpus: int):
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.prune import PruneConfig, prune

    config = PruneConfig(
        model=str(model_dir),
        calibration=CalibrationConfig("perplexity", f"text:{text}", samples=4, seq_len=32),
        drop=2,
        searches=("greedy",),
        out=out,
        gpus=gpus,
        progress=False,
    )
    (outcome,) = prune(config)
    return outcome


def test_prune_through_the_device_map_path_checkpoints_byte_identically(
    tiny_model_dirs, tmp_path, monkeypatch
):
    import pruning.model.blocks as models
    import pruning.model.placement as placement

    model_dir = tiny_model_dirs("qwen3")
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join("the cat sat on the mat and looked at the hen. " * 8 for _ in range(6)))
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home"))
    plain = _prune(model_dir, tmp_path / "plain", text, gpus=1)

    # "Three cards" that are all the CPU: from_pretrained gets a device_map, and BlockStack takes the spread
    # path (recorded arguments copied per card, states moved before every block, to the head after).
    maps, spread = [], []
    monkeypatch.setattr(placement, "spread_devices", lambda device, gpus: ["cpu"] * gpus)
    real_device_map = placement.device_map
    monkeypatch.setattr(placement, "device_map", lambda *a: maps.append(real_device_map(*a)) or maps[-1])
    real_init = models.BlockStack.__init__

    def spread_init(self, model):
        real_init(self, model)
        self.spread = True
        spread.append(self)

    monkeypatch.setattr(models.BlockStack, "__init__", spread_init)
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home2"))
    placed = _prune(model_dir, tmp_path / "placed", text, gpus=3)

    assert maps and len(maps[0]) >= 6 + 3 and spread
    assert placed.removed_blocks == plain.removed_blocks
    assert placed.calibration_loss == plain.calibration_loss
    plain_dir, placed_dir = Path(plain.checkpoint), Path(placed.checkpoint)
    weight_files = sorted(p.name for p in plain_dir.glob("*.safetensors"))
    assert weight_files == sorted(p.name for p in placed_dir.glob("*.safetensors"))
    for file in [*weight_files, "config.json"]:
        assert (plain_dir / file).read_bytes() == (placed_dir / file).read_bytes(), file


def test_spread_block_arguments_are_copied_once_per_card():
    from pruning.model.blocks import _on_device

    cpu = torch.device("cpu")
    mask, cos, sin = torch.ones(2, 2), torch.zeros(3), torch.zeros(3)
    copies: dict = {}
    moved = _on_device({"mask": mask, "position_embeddings": (cos, sin), "use_cache": False}, cpu, copies)
    assert moved["mask"] is mask and moved["position_embeddings"][0] is cos and moved["use_cache"] is False
    meta = torch.device("meta")
    first = _on_device({"mask": mask}, meta, copies)
    second = _on_device({"masks": {"full_attention": mask}}, meta, copies)
    assert first["mask"].device == meta and second["masks"]["full_attention"] is first["mask"]
