"""One plan builder per heavy command: prune, study, heal, eval and serve.

Each takes the parsed config.json (see :func:`~ground.planning.shape.read_model_config`), the run's
sizes and the devices, and returns a :class:`~ground.planning.plan.MemoryPlan` with advice. The sizes
a run should use are in ``plan.choices`` (``calibration_batch``, ``memory_budget_gb``, ``kl_reference``,
``max_model_len``, per-engine ``gpu_memory_utilization``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ground.planning import estimates as est
from ground.planning.devices import DTYPE_BYTES, GIB, Devices
from ground.planning.parameters import count_parameters, lora_parameters
from ground.planning.plan import HOST, Item, MemoryPlan, Step, with_advice
from ground.planning.shape import ModelShape, model_shape

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_BYTES_PER_PARAMETER = 16
"""fp32 adapter weight, gradient and two AdamW moments (peft keeps adapters in fp32)."""
VLLM_EVAL_SHARE = 0.85
"""``gpu_memory_utilization`` of the evaluation engine (pruning.evaluation.engines)."""
SERVE_TOTAL_SHARE = 0.9
"""What all engines on one card may claim together: below 1, room for the CUDA contexts."""
MIN_MAX_MODEL_LEN = 2048
"""Shortest context the serve planner offers before declaring that the engines do not fit."""
DEFAULT_HOST_PER_GPU = 2
"""Host memory assumed per byte of GPU memory when planning a machine we are not on."""


@dataclass(frozen=True)
class CalibrationSizes:
    """What the calibration side of prune/study runs over."""

    samples: int = 64
    """Calibration samples (text windows or choices)."""
    seq_len: int = 2048
    """Tokens per window."""
    keeps_dense_reference: bool = False
    """Whether the loss compares against the dense model's next-token distribution (an objective whose
    ``needs_reference`` fact is set, such as ``kl``, or any objective with ``--kl-weight``): the plan then
    holds that reference beside the boundary cache."""
    searches: tuple[str, ...] = ("greedy",)
    """Searches run (cbo backpropagates through every block)."""
    batch_size: int = 8
    """Largest calibration batch the run may use; the plan may pick a smaller one."""
    memory_budget_gb: float | None = None
    """The user's budget of the boundary cache, if given."""
    shared_evaluator: bool = True
    """Every search on one evaluator (``prune --timing shared``); False: a fresh evaluator per search."""


def _host_bytes(devices: Devices) -> int:
    """Host memory the boundary cache may spill to."""
    from ground.planning.devices import host_memory_bytes

    if devices.kind == "cpu":
        return devices.memory_bytes
    if devices.simulated:  # a machine we are not on: assume the usual host memory per GPU
        return devices.count * devices.memory_bytes * DEFAULT_HOST_PER_GPU
    return host_memory_bytes()


def _calibration_batch(
    shape: ModelShape, sizes: CalibrationSizes, dtype_bytes: int, free: int, cards: int = 1
) -> tuple[int, int]:
    """Largest batch <= ``sizes.batch_size`` whose activations (with the trie path's states, also one batch
    wide) take at most half of ``free`` (the rest is the boundary cache's), else the largest that fits at
    all; with those bytes."""

    def activations(batch: int) -> int:
        trie = est.trie_path_bytes(shape, batch, sizes.seq_len, dtype_bytes, cards)
        forward = est.forward_activation_bytes(
            shape, batch, sizes.seq_len, dtype_bytes, est.CALIBRATION_HEAD_CHUNK
        )
        if "cbo" not in sizes.searches:
            return trie + forward
        return trie + max(forward, est.backward_activation_bytes(shape, batch, sizes.seq_len, dtype_bytes))

    for limit in (free // 2, free):
        for batch in range(min(sizes.batch_size, sizes.samples), 0, -1):
            if activations(batch) <= limit:
                return batch, activations(batch)
    return 1, activations(1)


def _search_states(
    shape: ModelShape, sizes: CalibrationSizes, where: str, left: int, per_boundary: int
) -> Item:
    """The states the searches' paths add to the boundary cache, within the ``left`` bytes of its budget."""
    paths = est.search_state_paths(sizes.searches, sizes.shared_evaluator)
    if paths is None:
        return Item("search states (fill the cache budget)", left, where)
    boundaries = paths * (shape.num_layers - 1)
    kept = min(boundaries, left // max(per_boundary, 1))
    return Item(
        f"search states ({paths} path(s) of {shape.num_layers - 1} boundaries)",
        min(boundaries * per_boundary, left),
        where,
        "" if kept == boundaries else f"{kept} of {boundaries} fit the cache budget (LRU)",
    )


def _calibration_steps(shape: ModelShape, sizes: CalibrationSizes, dtype: str, devices: Devices):
    """Steps of the evaluator (dense pass, CBO gradients) and the sizes chosen for them."""
    dtype_bytes = DTYPE_BYTES[dtype]
    count = count_parameters(shape)
    weights = est.weights_on_fullest_device(count, dtype_bytes, devices.count)
    free = max(devices.usable_bytes - weights, 0)
    batch, activation = _calibration_batch(shape, sizes, dtype_bytes, free, devices.count)
    per_boundary = est.boundary_bytes(shape, sizes.samples, sizes.seq_len, dtype_bytes)
    # The KL reference's final hidden states sit beside the cache when its log-probs do not fit.
    reference_hidden = per_boundary if sizes.keeps_dense_reference else 0
    device_budget = (
        int(sizes.memory_budget_gb * GIB)
        if sizes.memory_budget_gb is not None
        else max(free - activation - reference_hidden, 0)
    )
    budget, where = device_budget, "device"
    slots = min(budget // max(per_boundary, 1), shape.num_layers)
    if devices.kind == "cuda" and slots < shape.num_layers:
        # The evaluator keeps the whole cache in host memory when the device cannot hold every boundary.
        where, budget = HOST, _host_bytes(devices) // 2
        slots = min(budget // max(per_boundary, 1), shape.num_layers)
    cache = Item(
        f"boundary cache ({slots} of {shape.num_layers} boundaries)",
        slots * per_boundary,
        where if devices.kind == "cuda" else "device",
        f"{per_boundary / GIB:.2f} GiB per boundary",
    )
    items = [Item("weights", weights, note=f"{devices.count} device(s)"), cache]
    choices = {
        "calibration_batch": batch,
        "memory_budget_gb": round(device_budget / GIB, 3),
        "boundary_slots": int(slots),
        "cache_on": cache.where,
    }
    advice = []
    if sizes.keeps_dense_reference:
        logprobs = est.kl_reference_logprob_bytes(shape, sizes.samples, sizes.seq_len)
        if slots * per_boundary + logprobs <= budget:
            items.append(Item("KL reference (dense log-probs)", logprobs, cache.where))
            choices["kl_reference"] = "logprobs"
        else:
            items.append(
                Item(
                    "KL reference (final hidden states)",
                    per_boundary,
                    cache.where,
                    "logits recomputed per chunk",
                )
            )
            choices["kl_reference"] = "chunked"
            advice.append(f"KL reference chunked: full log-probs would need {logprobs / GIB:.1f} GiB")
    # The budget left after the dense cache (and the KL log-probs it holds) is what search states may take.
    in_budget = sum(item.bytes for item in items[1:] if item.name != "KL reference (final hidden states)")
    items.append(_search_states(shape, sizes, cache.where, max(budget - in_budget, 0), per_boundary))
    trie = est.trie_path_bytes(shape, batch, sizes.seq_len, dtype_bytes, devices.count)
    items.append(Item(f"trie path (<= {shape.num_layers} states of one batch)", trie))
    forward = est.forward_activation_bytes(
        shape, batch, sizes.seq_len, dtype_bytes, est.CALIBRATION_HEAD_CHUNK
    )
    steps = [
        Step("dense reference pass and scoring", items + [Item(f"activations (batch {batch})", forward)])
    ]
    if "cbo" in sizes.searches:
        backward = est.backward_activation_bytes(shape, batch, sizes.seq_len, dtype_bytes)
        steps.append(Step("CBO gradients", items + [Item(f"backward activations (batch {batch})", backward)]))
    for step in steps:
        step.devices = devices.count
    return steps, choices, advice


def _plan(command: str, model: str, shape: ModelShape, dtype: str, devices: Devices, steps) -> MemoryPlan:
    total = count_parameters(shape).total
    notes = list(shape.notes)
    if devices.simulated and devices.kind == "cuda" and command in ("prune", "study"):
        notes.append(f"host memory assumed {DEFAULT_HOST_PER_GPU} x the GPUs' memory")
    return MemoryPlan(command, model, dtype, devices, total, total * DTYPE_BYTES[dtype], steps, notes=notes)


def plan_prune(config: dict, model: str, dtype: str, devices: Devices, sizes: CalibrationSizes) -> MemoryPlan:
    """Plan of ``prune``: load the model, the dense pass with its caches, the searches (CBO's backward)."""
    shape = model_shape(config)

    def build(on: Devices) -> MemoryPlan:
        steps, choices, advice = _calibration_steps(shape, sizes, dtype, on)
        plan = _plan("prune", model, shape, dtype, on, steps)
        plan.choices, plan.advice = choices, advice
        return plan

    return with_advice(build, devices, "device_map")


def engine_need(shape: ModelShape, dtype: str, max_model_len: int, tensor_parallel: int = 1, logprobs_len=0):
    """Bytes one vLLM engine needs per GPU: weights, profiled activations, KV of one full sequence."""
    dtype_bytes = DTYPE_BYTES[dtype]
    weights = count_parameters(shape).total * dtype_bytes
    return [
        Item("engine weights", weights // tensor_parallel),
        Item("engine activations", est.engine_activation_bytes(shape, dtype_bytes, logprobs_len)),
        Item(
            f"KV cache ({max_model_len} tokens)",
            est.kv_cache_bytes(shape, max_model_len, dtype_bytes) // tensor_parallel,
        ),
    ]


def _eval_step(
    shape: ModelShape, dtype: str, devices: Devices, engine: str, seq_len: int
) -> tuple[Step, dict]:
    """The evaluation engine (its own process): vLLM with its memory share, or a torch forward."""
    dtype_bytes = DTYPE_BYTES[dtype]
    if engine == "vllm":
        tensor_parallel = 1
        while True:
            items = engine_need(shape, dtype, seq_len + 1, tensor_parallel, logprobs_len=seq_len)
            need = sum(item.bytes for item in items)
            if need <= VLLM_EVAL_SHARE * devices.memory_bytes or tensor_parallel >= devices.count:
                break
            tensor_parallel *= 2
        items.append(
            Item(
                "rest of the engine's share (KV pool)",
                max(int(VLLM_EVAL_SHARE * devices.memory_bytes) - need, 0),
            )
        )
        choices = {
            "eval_tensor_parallel_size": tensor_parallel,
            "eval_gpu_memory_utilization": VLLM_EVAL_SHARE,
        }
        return Step("evaluation (vLLM engine, own process)", items, tensor_parallel), choices
    count = count_parameters(shape)
    items = [
        Item("weights", est.weights_on_fullest_device(count, dtype_bytes, devices.count)),
        Item(
            "activations (1 window)",
            est.forward_activation_bytes(shape, 1, seq_len, dtype_bytes, est.EVALUATION_HEAD_CHUNK),
        ),
    ]
    return Step("evaluation (torch engine)", items, devices.count), {}


def plan_eval(
    config: dict, model: str, dtype: str, devices: Devices, engine: str, seq_len: int
) -> MemoryPlan:
    """Plan of ``eval``: one engine per variant, one after the other."""
    shape = model_shape(config)

    def build(on: Devices) -> MemoryPlan:
        step, choices = _eval_step(shape, dtype, on, engine, seq_len)
        plan = _plan("eval", model, shape, dtype, on, [step])
        plan.choices = choices
        return plan

    return with_advice(build, devices, "tensor parallel" if engine == "vllm" else "device_map")


@dataclass(frozen=True)
class HealSizes:
    """What ``heal`` trains."""

    method: str = "lora"
    """lora or distill (distill loads the dense teacher beside the student)."""
    full_finetune: bool = False
    """distill: train every weight of the student, not adapters."""
    batch_size: int = 8
    """Windows per step."""
    seq_len: int = 512
    """Tokens per window."""
    lora_rank: int = 8
    """Adapter rank."""
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    """Projections that get adapters."""
    last_blocks: int = 3
    """last-blocks: blocks trained whole besides the LM head."""
    patch_windows: int = 128
    """patch: calibration windows whose activations are gathered."""
    patch_spans: int = 1
    """patch: maps estimated (maximal runs of removed blocks)."""
    patch_keeps_rows: bool = False
    """patch: the cosine estimator keeps every calibration token's activations (on the host)."""


def _patch_step(student: ModelShape, dense: ModelShape, dtype: str, devices: Devices, sizes: HealSizes):
    """The patch: the dense model runs the calibration windows; per span, the d x d normal equations in
    float64 (and for the cosine estimator every token's input and target rows, float32 on the host). The
    variant loads after the dense model is freed, so the dense model's weights are the step's peak."""
    dtype_bytes = DTYPE_BYTES[dtype]
    dense_count = count_parameters(dense)
    hidden = dense.hidden_size
    items = [
        Item("dense model weights", est.weights_on_fullest_device(dense_count, dtype_bytes, devices.count)),
        Item(
            f"forward activations ({sizes.batch_size} x {sizes.seq_len})",
            est.block_activation_bytes(dense, sizes.batch_size * sizes.seq_len, dtype_bytes) * 2,
            note="a block's peak plus the span's input and residual kept",
        ),
        Item(
            f"normal equations ({sizes.patch_spans} x 2 x {hidden}^2, float64)",
            sizes.patch_spans * 2 * hidden**2 * 8,
        ),
    ]
    if sizes.patch_keeps_rows:
        tokens = sizes.patch_windows * sizes.seq_len
        rows = sizes.patch_spans * 2 * tokens * hidden * est.FP32
        items.append(Item(f"cosine estimator rows ({tokens} tokens)", rows, where=HOST))
    return Step("patch (dense activations, normal equations)", items, devices.count)


def _heal_step(
    student: ModelShape, teacher: ModelShape | None, dtype: str, devices: Devices, sizes: HealSizes
):
    dtype_bytes = DTYPE_BYTES[dtype]
    count = count_parameters(student)
    items = [Item("student weights", est.weights_on_fullest_device(count, dtype_bytes, devices.count))]
    if sizes.method == "distill" and teacher is not None:
        teacher_count = count_parameters(teacher)
        items.append(
            Item("teacher weights", est.weights_on_fullest_device(teacher_count, dtype_bytes, devices.count))
        )
    if sizes.method == "patch" and teacher is not None:
        return _patch_step(student, teacher, dtype, devices, sizes)
    if sizes.method == "last-blocks":
        trainable = (
            count.head + sum(count.blocks[-sizes.last_blocks :]) + (count.embedding if count.tied else 0)
        )
        items.append(
            Item(
                f"gradients and AdamW states (head + last {sizes.last_blocks})",
                est.optimizer_bytes(trainable, dtype_bytes),
            )
        )
    elif sizes.full_finetune:
        trainable = count.total // devices.count
        items.append(Item("gradients and AdamW states (full)", est.optimizer_bytes(trainable, dtype_bytes)))
    else:
        adapters = lora_parameters(student, sizes.lora_rank, sizes.lora_targets)
        items.append(
            Item(f"LoRA r={sizes.lora_rank} weights, gradients, AdamW", adapters * LORA_BYTES_PER_PARAMETER)
        )
    backward = est.backward_activation_bytes(
        student, sizes.batch_size, sizes.seq_len, dtype_bytes, head_chunk=est.HEAD_CHUNK_POSITIONS
    )
    items.append(
        Item(f"backward activations ({sizes.batch_size} x {sizes.seq_len})", backward // devices.count)
    )
    return Step(f"healing ({sizes.method}{', full' if sizes.full_finetune else ''})", items, devices.count)


def plan_heal(
    config: dict, teacher_config: dict | None, model: str, dtype: str, devices: Devices, sizes: HealSizes
) -> MemoryPlan:
    """Plan of ``heal``: the variant (and for distill the dense teacher), optimizer states, activations; for
    the patch, the dense model's forward over the calibration windows and the normal equations."""
    student = model_shape(config)
    teacher = model_shape(teacher_config) if teacher_config else None

    def build(on: Devices) -> MemoryPlan:
        return _plan("heal", model, student, dtype, on, [_heal_step(student, teacher, dtype, on, sizes)])

    plan = with_advice(build, devices, "device_map")
    if not plan.fits and sizes.full_finetune:
        plan.advice.append("or heal with LoRA adapters (drop --full-finetune)")
    return plan


def plan_study(
    config: dict,
    model: str,
    dtype: str,
    devices: Devices,
    sizes: CalibrationSizes,
    engine: str,
    eval_seq_len: int,
    heal: HealSizes | None = None,
) -> MemoryPlan:
    """Plan of ``study``: a prune cell, then its evaluation (and healing) in processes of their own."""
    shape = model_shape(config)

    def build(on: Devices) -> MemoryPlan:
        steps, choices, advice = _calibration_steps(shape, sizes, dtype, on)
        step, eval_choices = _eval_step(shape, dtype, on, engine, eval_seq_len)
        steps.append(step)
        if heal is not None:
            steps.append(_heal_step(shape, shape if heal.method == "distill" else None, dtype, on, heal))
        plan = _plan("study", model, shape, dtype, on, steps)
        plan.choices, plan.advice = {**choices, **eval_choices}, advice
        plan.choices["gpus_per_cell"] = max(step.devices for step in steps) if on.kind == "cuda" else 0
        return plan

    return with_advice(build, devices, "device_map")


def _largest_fitting_len(engines, dtype: str, devices: Devices, native: int, drafts=None) -> int:
    """Longest power-of-two context (at most ``native``) at which every engine fits its card."""
    length = 1 << (max(native, MIN_MAX_MODEL_LEN).bit_length() - 1)
    while length > MIN_MAX_MODEL_LEN and _place(engines, dtype, devices, length, drafts)[1] > 1:
        length //= 2
    return max(min(length, native), MIN_MAX_MODEL_LEN)


def _place(engines, dtype: str, devices: Devices, max_model_len: int, drafts=None):
    """Engines (name, replica, shape, tensor_parallel) on GPUs, largest need first, each on the least loaded
    cards that hold no other replica of its variant (a second engine on the same card would compete for its
    compute and halve its KV pool, adding nothing vLLM's own batching does not).

    Returns:
        The placed engines (name, replica, shape, tp, need, cards), the fullest card's load as a share of
        what its engines may claim, each card's load, and the engines that found no cards.
    """
    loads = [0] * devices.count
    holding: dict[str, set[int]] = {}  # cards that already run a replica of each variant
    placed, unplaced = [], []
    drafts = drafts or {}
    needs = [
        (
            name,
            replica,
            shape,
            tp,
            sum(i.bytes for i in engine_need(shape, dtype, max_model_len, tp))
            + (
                sum(i.bytes for i in engine_need(drafts[name], dtype, max_model_len, tp))
                if name in drafts
                else 0
            ),
        )
        for name, replica, shape, tp in engines
    ]
    for name, replica, shape, tp, need in sorted(needs, key=lambda item: -item[4]):
        taken = holding.setdefault(name, set())
        free = sorted(set(range(devices.count)) - taken, key=lambda card: (loads[card], card))
        if len(free) < tp:
            unplaced.append((name, replica, tp))
            continue
        cards = sorted(free[:tp])
        for card in cards:
            loads[card] += need
        taken.update(cards)
        placed.append((name, replica, shape, tp, need, cards))
    fullest = max(loads) / (SERVE_TOTAL_SHARE * devices.memory_bytes)
    return placed, fullest, loads, unplaced


def _card_shortfalls(engines, unplaced, devices: Devices) -> list[str]:
    """One line per variant whose replicas found too few cards of their own."""
    lines = []
    for name in dict.fromkeys(name for name, _, _ in unplaced):
        replicas = sum(1 for engine in engines if engine[0] == name)
        tp = next(tp for unplaced_name, _, tp in unplaced if unplaced_name == name)
        lines.append(
            f"{name}: {replicas} replica(s) x tensor parallel {tp} need {replicas * tp} GPUs (no two "
            f"replicas of a variant share a card), {devices.count} available"
        )
    return lines


def _engine_share(need: int, cards: list[int], loads: list[int]) -> float:
    """The engine's ``gpu_memory_utilization``: its part of the fullest of its cards' SERVE_TOTAL_SHARE.

    vLLM gives a tensor-parallel engine the same share on every card, so the share is taken on its fullest
    card; on every card the shares then add up to at most SERVE_TOTAL_SHARE (rounded down, never up).
    """
    share = SERVE_TOTAL_SHARE * need / max(max(loads[card] for card in cards), 1)
    return math.floor(round(min(share, SERVE_TOTAL_SHARE) * 1000, 6)) / 1000  # 0.9 stays 0.9


def plan_serve(
    engines: list[tuple[str, dict, int]], dtype: str, devices: Devices, max_model_len: int | None = None
) -> MemoryPlan:
    """Plan of ``serve``: every variant's vLLM engine(s), their cards, context and memory shares.

    Args:
        engines: (variant name, its config.json, tensor_parallel_size) per engine; a name given k times is
            k replicas of that variant, numbered 0..k-1 in order, placed on cards of their own. A fourth
            item, the config.json of a speculative draft model, adds the draft's weights, activations and KV
            cache to that engine (vLLM runs the draft inside the target's engine, in its memory share).
        max_model_len: context of every engine; None lets the planner choose the longest that fits.
    """
    seen: dict[str, int] = {}
    shaped = []
    drafts: dict[str, ModelShape] = {}
    for name, config, tp, *draft in engines:
        seen[name] = seen.get(name, -1) + 1
        shaped.append((name, seen[name], model_shape(config), tp))
        if draft and draft[0]:
            drafts[name] = model_shape(draft[0])
    native = min(shape.max_position_embeddings for _, _, shape, _ in shaped)
    several = {name for name, count in seen.items() if count > 0}

    def build(on: Devices) -> MemoryPlan:
        length = max_model_len or _largest_fitting_len(shaped, dtype, on, native, drafts)
        placed, _, loads, unplaced = _place(shaped, dtype, on, length, drafts)
        chosen = [
            {
                "variant": name,
                "replica": replica,
                "gpus": cards,
                "tensor_parallel_size": tp,
                "gpu_memory_utilization": _engine_share(need, cards, loads),
            }
            for name, replica, _, tp, need, cards in sorted(placed, key=lambda engine: engine[:2])
        ]
        steps = []
        for card in range(on.count):
            items = [
                Item(
                    f"{name}{f' replica {replica}' if name in several else ''} engine (tensor parallel {tp})",
                    need,
                    note=f"context {length} tokens" + (", with its draft model" if name in drafts else ""),
                )
                for name, replica, _, tp, need, cards in placed
                if card in cards
            ]
            if items:
                steps.append(Step(f"GPU {card}: {len(items)} engine(s)", items, 1))
        largest = max(shaped, key=lambda item: count_parameters(item[2]).total)[2]
        names = ", ".join(dict.fromkeys(name for name, *_ in shaped))
        plan = _plan("serve", names, largest, dtype, on, steps)
        plan.choices = {"max_model_len": length, "engines": chosen}
        plan.shortfalls = _card_shortfalls(engines, unplaced, on)
        return plan

    plan = with_advice(build, devices, "more cards for the engines")
    if not plan.fits:
        plan.advice.append(
            "or fewer --replicas or a smaller --tensor-parallel"
            if plan.shortfalls
            else "or lower --max-model-len, or serve fewer variants per card"
        )
    return plan


def shape_for(config: dict, num_layers: int) -> dict:
    """A config of the same model with ``num_layers`` blocks (what a pruned variant's config says)."""
    text = config.get("text_config")
    if isinstance(text, dict):
        return {**config, "text_config": shape_for(text, num_layers)}
    sliced = {**config, "num_hidden_layers": num_layers}
    if config.get("layer_types"):
        sliced["layer_types"] = list(config["layer_types"])[:num_layers]
    return sliced


__all__ = [
    "CalibrationSizes",
    "HealSizes",
    "plan_eval",
    "plan_heal",
    "plan_prune",
    "plan_serve",
    "plan_study",
    "shape_for",
]
