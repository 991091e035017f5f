"""The ``device_map`` of a model spread over several GPUs, from the memory planner's block placement.

``prune``, ``heal`` and the torch evaluation engine load a model larger than one card with ``--gpus N``:
:func:`device_map` turns :func:`ground.planning.placement.place_blocks` (contiguous runs of blocks, the
embedding on the first card, the final norm and LM head on the last, a tied head with the embedding) into
the ``{module name: device}`` dict that ``from_pretrained(device_map=...)`` hands to accelerate. Every block
is one entry, so a block is never split across cards (the decoder-layer class is the unit accelerate's
``no_split_module_classes`` would name). The module names are read from the model itself, built on the meta
device (no weights), so every architecture gets a complete map without a table of names.

Example: ``device_map(config, ["cuda:0", "cuda:1"])`` for a 32-block Llama gives
``{"model.embed_tokens": "cuda:0", "model.layers.0": "cuda:0", ..., "model.layers.31": "cuda:1",
"model.norm": "cuda:1", "model.rotary_emb": "cuda:0", "lm_head": "cuda:1"}``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ground.core.errors import UserError
from ground.planning import count_parameters, model_shape
from ground.planning.placement import place_blocks


def spread_devices(device: str, gpus: int) -> list[str]:
    """The ``gpus`` cards a run on ``device`` spreads over: ``cuda:K`` .. ``cuda:K+gpus-1``.

    Raises:
        UserError: several cards asked of a device that is not CUDA.
    """
    if gpus <= 1:
        return [device]
    if not device.startswith("cuda"):
        raise UserError(f"--gpus {gpus} spreads a model over CUDA devices; --device is {device}")
    first = int(device.split(":")[1]) if ":" in device else 0
    return [f"cuda:{first + offset}" for offset in range(gpus)]


def device_map(config, devices: Sequence[str]) -> dict[str, str]:
    """``{module name: device}`` placing ``config``'s model over ``devices`` as the planner does.

    Args:
        config: a transformers config of a supported causal LM.
        devices: the devices in order (the first holds the embedding, the last the head); repeated names
            are allowed (a test spreads over ``["cpu", "cpu"]`` to run this path without a GPU).

    Returns:
        A complete map: every parameter and buffer of the model lies under exactly one of its names.
    """
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    count = count_parameters(model_shape(config.to_dict()))
    placement = place_blocks(count, len(devices), bool(getattr(config, "tie_word_embeddings", False)))
    with init_empty_weights(), torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    decoder = skeleton.model
    first, head = devices[placement.embedding_device], devices[placement.head_device]
    mapping: dict[str, str] = {}
    for name, child in skeleton.named_children():
        if child is not decoder:
            mapping[name] = head if name == "lm_head" else first
            continue
        for part, _ in decoder.named_children():
            if part == "layers":
                for index, card in enumerate(placement.block_devices):
                    mapping[f"{name}.layers.{index}"] = devices[card]
            else:
                mapping[f"{name}.{part}"] = head if part == "norm" else first
    return mapping


def map_devices(mapping: dict[str, str]) -> list[str]:
    """The distinct devices of a map, in first-seen order."""
    return list(dict.fromkeys(str(device) for device in mapping.values()))
