"""Several depth variants served from one copy of the weights: the price in a forward pass (issue 58 item 2).

A depth-pruned variant is a subset of the dense model's blocks, yet each served variant today is its own vLLM
engine with its own copy of the weights. This measures what one engine holding ONE copy and running each
request through its own block mask would give up per token. On Llama-3.1-8B's shape (random bfloat16 weights
built on the card, as ``benchmarks.gpu_scale`` does; time does not depend on the values), a batch of B
sequences is split evenly among k masks (k = 1, 2, 4), each removing 25 % of the blocks, different blocks
(mask j removes block i when i mod 4 = j: disjoint for Llama's 32), and run three ways:

(a) ``separate``: k sub-batches, each through its own mask's block list (what k engines do, one copy each);
(b) ``gathered``: one batch; each block runs on the rows of the masks that keep it, gathered
    (``index_select``) and scattered back (``index_copy_``); rows whose mask removes it pass unchanged;
(c) ``dense``: every block on the whole batch (the unpruned model; 4/3 of (a)'s block work).

Phases: ``prefill`` (B = 8 sequences of 2,048 new tokens, keys and values written to the cache) and
``decode`` (one new token per sequence per step at B = 64 and 256, attending to a KV cache of ``--context``
positions per sequence). The KV cache is an honest stand-in for vLLM's paged one: per block, contiguous
preallocated key and value tensors ``[rows, kv_heads, context + steps, head_dim]`` filled with random values
(attention's time does not depend on them), to which each step appends and over which SDPA attends in full
(no mask is needed: every cached position is visible). Each arm only holds caches for the blocks its rows
run. A step runs the blocks and the final norm and LM head on each sequence's last position (as a server
does); the embedding lookup is left out (the same in every arm).

Timing: CUDA events around each repeat after a warm-up repeat, ``--repeats`` repeats per arm (median and
range), arms in the order (a), (b), (c), (a) again (the second (a) shows the drift over an arm's time).
Reported per k and phase: tokens/s of each arm and their ratio to (a), and the weights of one copy (the
dense model, which serves every mask) against k copies (k pruned checkpoints, one per engine).

    python -m benchmarks.gpu_mixed_depth --out "$OUT/mixed_depth.json"   # one H200: about a minute
    python -m benchmarks.gpu_mixed_depth --smoke --out /tmp/mixed.json   # a tiny shape on the CPU
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks import gpu_scale

MASK_PERIOD = 4
"""Mask j removes block i when i mod 4 = j: a quarter of the blocks each, disjoint for up to 4 masks."""
KS = (1, 2, 4)
ARMS = ("separate", "gathered", "dense", "separate_again")
SMOKE = dict(
    config="tiny", device="cpu", dtype="float32", prefill_batch=4, prefill_len=16, decode_batches="8",
    context=16, steps=2, repeats=2,
)  # fmt: skip


def masks(k: int, num_blocks: int) -> list[frozenset[int]]:
    """``k`` removal sets of a quarter of the blocks each (module docstring); for fewer than 16 blocks (the
    smoke model) each still removes ``round(N / 4)`` blocks, wrapping around."""
    count = max(1, round(num_blocks / MASK_PERIOD))
    return [frozenset((j + MASK_PERIOD * t) % num_blocks for t in range(count)) for j in range(k)]


class PrefilledCache:
    """Per-block keys and values, preallocated, that HF attention appends to (its ``update`` call).

    ``rows[i]`` is how many sequences block i holds keys for; positions ``0..filled`` are random "history".
    """

    def __init__(self, stack, rows: dict[int, int], capacity: int, filled: int):
        import torch

        config = stack.config
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = stack.lm_head.weight.dtype
        self.keys, self.values = {}, {}
        for index, count in rows.items():
            size = (count, heads, capacity, head_dim)
            device = stack.block_devices[index]
            self.keys[index] = torch.empty(size, dtype=dtype, device=device).normal_()
            self.values[index] = torch.empty(size, dtype=dtype, device=device).normal_()
        self.filled = filled
        self.length = dict.fromkeys(rows, filled)

    def rewind(self) -> None:
        self.length = dict.fromkeys(self.length, self.filled)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        start = self.length[layer_idx]
        end = start + key_states.shape[2]
        self.keys[layer_idx][:, :, start:end] = key_states
        self.values[layer_idx][:, :, start:end] = value_states
        self.length[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    @property
    def bytes(self) -> int:
        return sum(
            tensor.numel() * tensor.element_size() for tensor in [*self.keys.values(), *self.values.values()]
        )


def rotary(stack, hidden, start: int, length: int):
    """The rotary table of positions ``start..start+length-1``, one row broadcast over the batch."""
    import torch

    positions = torch.arange(start, start + length, device=hidden.device)[None]
    return stack.rotary_emb(hidden[:1], positions)


def block_kwargs(stack, hidden, start: int, length: int, cache) -> dict:
    return {
        "attention_mask": None,
        "position_embeddings": rotary(stack, hidden, start, length),
        "past_key_values": cache,
        "use_cache": True,
    }


def head_last(stack, hidden):
    return stack.head(hidden[:, -1:])


class Arm:
    """One way to run a batch split among masks: its caches, and one forward of the whole batch."""

    def __init__(
        self, stack, arm: str, removed: list[frozenset[int]], batch: int, capacity: int, filled: int
    ):
        import torch

        self.stack, self.arm = stack, arm
        blocks = range(stack.num_blocks)
        share = batch // len(removed)
        if arm == "dense":
            self.plan = [(list(blocks), None)]
            self.caches = [PrefilledCache(stack, dict.fromkeys(blocks, batch), capacity, filled)]
        elif arm.startswith("separate"):
            self.plan = [([i for i in blocks if i not in mask], None) for mask in removed]
            self.caches = [
                PrefilledCache(stack, dict.fromkeys(kept, share), capacity, filled) for kept, _ in self.plan
            ]
        else:  # gathered: per block, the rows of the masks that keep it
            owner = torch.arange(batch, device=stack.device) // share
            self.rows = {
                i: (owner[:, None] == torch.tensor(keeping, device=stack.device)).any(1).nonzero().flatten()
                for i in blocks
                if (keeping := [j for j, mask in enumerate(removed) if i not in mask])
            }
            self.plan = [(list(self.rows), self.rows)]
            counts = {i: int(rows.numel()) for i, rows in self.rows.items()}
            self.caches = [PrefilledCache(stack, counts, capacity, filled)]
        self.batch, self.share = batch, share

    def forward(self, hidden, start: int):
        """One step: ``hidden`` ``[batch, new tokens, hidden]`` from position ``start``; returns the logits of
        each sequence's last position."""
        length = hidden.shape[1]
        if self.arm.startswith("separate"):
            outputs = []
            for part, ((kept, _), cache) in enumerate(zip(self.plan, self.caches, strict=True)):
                rows = hidden[part * self.share : (part + 1) * self.share]
                kwargs = block_kwargs(self.stack, rows, start, length, cache)
                for index in kept:
                    rows = self.stack.blocks[index](rows, **kwargs)
                outputs.append(head_last(self.stack, rows))
            return outputs
        (kept, gathered), cache = self.plan[0], self.caches[0]
        kwargs = block_kwargs(self.stack, hidden, start, length, cache)
        hidden = hidden.clone()
        for index in kept:
            rows = None if gathered is None else gathered[index]
            if rows is None or rows.numel() == self.batch:
                hidden = self.stack.blocks[index](hidden, **kwargs)
            else:
                output = self.stack.blocks[index](hidden.index_select(0, rows), **kwargs)
                hidden.index_copy_(0, rows, output)
        return [head_last(self.stack, hidden)]

    def rewind(self) -> None:
        for cache in self.caches:
            cache.rewind()

    @property
    def cache_bytes(self) -> int:
        return sum(cache.bytes for cache in self.caches)


def time_arm(arm: Arm, hidden, start: int, steps: int, repeats: int, device: str) -> list[float]:
    """Seconds of ``steps`` forwards, ``repeats`` times after one warm-up (CUDA events on a GPU)."""
    import torch

    def one_repeat():
        arm.rewind()
        for step in range(steps):
            arm.forward(hidden, start + step * hidden.shape[1])

    with torch.no_grad():
        one_repeat()  # warm-up: kernels chosen, allocator primed
        seconds = []
        for _ in range(repeats):
            if device.startswith("cuda"):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                begin.record()
                one_repeat()
                end.record()
                torch.cuda.synchronize()
                seconds.append(begin.elapsed_time(end) / 1e3)
            else:
                started = time.perf_counter()
                one_repeat()
                seconds.append(time.perf_counter() - started)
    return seconds


def phase_context(stack, batch: int, wanted: int, steps: int, device: str) -> int:
    """The decode context: ``wanted`` positions, halved until the dense arm's cache fits 3/4 of the free
    memory (an 80 GiB card at batch 256 holds less than 2,048 positions beside the weights)."""
    if not device.startswith("cuda"):
        return wanted
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    config = stack.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = 2 * stack.num_blocks * batch * config.num_key_value_heads * head_dim * 2
    context = wanted
    while context > 128 and per_position * (context + steps) > 0.75 * free:
        context //= 2
    return context


def measure_phase(stack, k: int, phase: dict, args) -> dict:
    """Tokens/s of every arm for one k and phase, and their ratios to (a)."""
    import torch

    removed = masks(k, stack.num_blocks)
    batch, length, filled, steps = phase["batch"], phase["new_tokens"], phase["context"], phase["steps"]
    hidden = torch.randn(
        batch, length, stack.config.hidden_size, device=stack.device, dtype=stack.lm_head.weight.dtype
    )
    arms = {}
    for name in ARMS:
        # the last arm's caches (freed with it: no cycles) back to the card
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        arm = Arm(stack, name, removed, batch, filled + steps * length, filled)
        seconds = time_arm(arm, hidden, filled, steps, args.repeats, args.device)
        tokens = batch * length * steps
        rates = [tokens / value for value in seconds]
        arms[name] = {
            "tokens_per_second": round(statistics.median(rates), 1),
            "range": [round(min(rates), 1), round(max(rates), 1)],
            "repeats": len(rates),
            "cache_gib": gpu_scale.gib(arm.cache_bytes),
        }
        del arm
    base = arms["separate"]["tokens_per_second"]
    for entry in arms.values():
        entry["of_separate"] = round(entry["tokens_per_second"] / base, 3)
    return {
        "k": k,
        **{key: phase[key] for key in ("phase", "batch", "context", "new_tokens", "steps")},
        "arms": arms,
    }


def weight_gib(stack, k: int) -> dict:
    """Weights of one copy (the dense model: it serves every mask) and of k pruned copies (one per engine)."""
    block_bytes = [sum(p.numel() * p.element_size() for p in block.parameters()) for block in stack.blocks]
    total = sum(p.numel() * p.element_size() for p in stack.model.parameters())
    rest = total - sum(block_bytes)
    copies = sum(
        rest + sum(b for i, b in enumerate(block_bytes) if i not in mask)
        for mask in masks(k, len(block_bytes))
    )
    return {"one_copy_gib": gpu_scale.gib(total), "k_copies_gib": gpu_scale.gib(copies)}


def phases(stack, args) -> list[dict]:
    found = [
        {
            "phase": "prefill",
            "batch": args.prefill_batch,
            "context": 0,
            "new_tokens": args.prefill_len,
            "steps": 1,
        }
    ]
    for batch in (int(part) for part in str(args.decode_batches).split(",")):
        context = phase_context(stack, batch, args.context, args.steps, args.device)
        found.append(
            {"phase": "decode", "batch": batch, "context": context, "new_tokens": 1, "steps": args.steps}
        )
    return found


def run(args) -> dict:
    from pruning.model.blocks import BlockStack

    started = time.perf_counter()
    config = gpu_scale.model_config(args.config)
    stack = BlockStack(gpu_scale.build_model(config, args.device, args.dtype))
    name = gpu_scale.device_name(args.device)
    record = {
        "device": name,
        "model": args.config,
        "dtype": args.dtype,
        "weights": "random (same shape; time does not depend on the values)",
        "masks": {str(k): [sorted(mask) for mask in masks(k, stack.num_blocks)] for k in KS},
        "kv_cache": "per block, preallocated contiguous keys/values filled with random values; SDPA over all",
        "timing": f"CUDA events, one warm-up then {args.repeats} repeats per arm; median and range",
        "git_commit": args.commit or gpu_scale.git_commit(),
        "model_build_seconds": round(time.perf_counter() - started, 1),
        "budget_seconds": args.budget_seconds,
        "weights_gib": {str(k): weight_gib(stack, k) for k in KS},
        "runs": [],
        "skipped": [],
        "complete": False,
    }
    for phase in phases(stack, args):
        for k in KS:
            if time.perf_counter() - started > args.budget_seconds:
                record["skipped"].append({"k": k, "phase": phase["phase"], "batch": phase["batch"]})
                continue
            result = measure_phase(stack, k, phase, args)
            record["runs"].append(result)
            arms = result["arms"]
            print(
                f"k={k} {phase['phase']:7s} B={phase['batch']:3d}: "
                f"(a) {arms['separate']['tokens_per_second']:>10,.0f} tok/s"
                + "".join(f"  {arm} {arms[arm]['of_separate']:.3f}x" for arm in ARMS[1:])
            )
            gpu_scale.write_record(args.out, record)
    record.update(elapsed_seconds=round(time.perf_counter() - started, 1), complete=True)
    return record


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="A tiny shape on the CPU (seconds).")
    parser.add_argument("--config", default=gpu_scale.LLAMA_8B, help="A public config of the testing kit.")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prefill-batch", type=int, default=8, help="Sequences in the prefill batch.")
    parser.add_argument("--prefill-len", type=int, default=2048, help="Tokens per prefilled sequence.")
    parser.add_argument("--decode-batches", default="64,256", help="Decode batch sizes, comma-separated.")
    parser.add_argument("--context", type=int, default=2048, help="Cached positions per sequence in decode.")
    parser.add_argument("--steps", type=int, default=16, help="Decode steps per timed repeat.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-seconds", type=float, default=120.0, help="Start no run past this.")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", type=Path, default=Path("docs/gpu-results/mixed_depth.json"))
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        if args.out == parser.get_default("out"):
            parser.error("--smoke writes no committed result: give --out")
        if args.budget_seconds == parser.get_default("budget_seconds"):
            args.budget_seconds = float("inf")  # a loaded CPU is slow, not over a lease
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    gpu_scale.write_record(args.out, result)
    print(f"wrote {args.out}: {len(result['runs'])} runs, skipped {len(result['skipped'])}")
    return result


if __name__ == "__main__":
    main()
