"""The Markdown sections of docs/benchmarks.md that ``python -m benchmarks.bench_real_model write`` composes
from its records.

One function per section (quality, searches, evaluator, load test, healing), each None until its records
exist.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.docs_section import write_section
from benchmarks.real_model_setup import (
    BUSY_LOAD,
    CALIBRATION,
    DROP,
    EVAL_FLAGS,
    EVALUATOR_TITLE,
    HEAL_METHODS,
    HEAL_SEARCH,
    HEALING_TITLE,
    LOADTEST_NAMES,
    LOADTEST_TITLE,
    MODEL,
    QUALITY_SEARCHES,
    QUALITY_TITLE,
    SEARCHES_SKIPPED,
    SEARCHES_TITLE,
    THREADS_NOTE,
    Results,
    heal_outcome,
    load_note,
)
from loadtest.compare import geometric_mean
from pruning.study.statistics import jaccard


def searches_table(found: Results, objective: str) -> list[str]:
    """One objective's rows of the searches section (empty before its stage ran)."""
    record = found.record(f"searches-{objective}")
    if record is None:
        return []
    lines = record["output"]
    best = min(line["calibration_loss"] for line in lines)
    data, samples, seq_len = CALIBRATION[objective]
    rows = [
        f"**{objective}** on `{data}` ({samples} × ≤{seq_len} tokens; dense loss "
        f"{lines[0]['dense_loss']:.4f}; "
        f"{record['started']}, {record['wall_seconds'] / 60:.1f} min in all, {load_note(record)}). Command:",
        "",
        f"    {record['command']}",
        "",
        "| search | removed blocks | calibration loss | gap to best | wall s | subset evaluations "
        "| block-forwards |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for line in lines:
        note = " ¹" if line["options"].get("prior_charged") else ""
        rows.append(
            f"| {line['search']}{note} | {line['removed_blocks']} | {line['calibration_loss']:.4f} | "
            f"{line['calibration_loss'] - best:+.4f} | {line['search_seconds']:.1f} | "
            f"{line['subset_evaluations']:,} | {line['block_forwards']:,} |"
        )
    return rows + [""]


def searches_reading(found: Results) -> list[str]:
    """Generated reading: the best search per objective, the quickest one's gap, the objectives' overlap."""
    sentences = []
    for objective in CALIBRATION:
        lines = found.variants(objective)
        if not lines:
            continue
        best, one_shot = found.variant(objective, "best"), found.variant(objective, "one_shot")
        cheapest = min(lines, key=lambda line: line["search_seconds"])
        below_dense = ", below dense" if best["calibration_loss"] < best["dense_loss"] else ""
        quickest = (
            ", also the quickest"
            if cheapest["name"] == best["name"]
            else f"; the quickest, {cheapest['search']} ({cheapest['search_seconds']:.1f} s), is "
            f"{cheapest['calibration_loss'] - best['calibration_loss']:+.3f} off"
        )
        sentences.append(
            f"under {objective} the lowest loss came from {best['search']} ({best['calibration_loss']:.3f}"
            f"{below_dense}; {best['subset_evaluations']} subset evaluation(s), "
            f"{best['search_seconds']:.0f} s"
            f"{quickest}; one_shot is {one_shot['calibration_loss'] - best['calibration_loss']:+.3f} off)"
        )
    if len(sentences) == 2:
        first, second = (found.variant(objective, "best")["removed_blocks"] for objective in CALIBRATION)
        sentences.append(f"the two objectives' best sets share Jaccard {jaccard(first, second):.2f}")
    return ["Reading (from the records): " + "; ".join(sentences) + "."] if sentences else []


def searches_section(found: Results) -> str | None:
    """``## SmolLM2-135M: searches``."""
    body = [row for objective in CALIBRATION for row in searches_table(found, objective)]
    if not body:
        return None
    intro = [
        SEARCHES_TITLE,
        "",
        f"The real model (`{MODEL}`, SmolLM2-135M-Instruct, N = 30 blocks, float32), M = {DROP} "
        "(27 %), seed 0, one shared evaluator per objective, searches run in the order listed; "
        f"`python -m benchmarks.bench_real_model searches-perplexity searches-task_margin`. {THREADS_NOTE} "
        "*Gap to best* is the calibration loss above the lowest any of these searches found (no exact "
        "optimum: C(30, 8) = 5.9 M subsets). *Wall s* and *block-forwards* are the evaluator's work while "
        "the search ran, plus, for the searches marked ¹, the shared single-block prior's (30 subsets); a "
        "subset an earlier search scored is free (the memo). The similarity baselines (block_influence, "
        "lorp, streamline) read the dense reference pass that the evaluator makes anyway and score only "
        "their answer. Genetic ran with population 8 and 5 generations (the study's 16 × 10 does not fit).",
        "",
    ]
    return "\n".join(intro + body + searches_reading(found) + ["", SEARCHES_SKIPPED])


def number(value: float) -> str:
    """Two decimals, or a whole number with thousands separators from 1,000 on (a broken model's
    perplexity)."""
    return f"{value:.2f}" if value < 1000 else f"{value:,.0f}"


def quality_row(found: Results, label: str, name: str, line: dict | None, dense: dict | None) -> str | None:
    """One model's row: removal, calibration loss, held-out perplexity and cloze accuracy (None: not
    measured yet)."""
    measured = found.quality(name)
    if measured is None:
        return None
    loss = f"{line['calibration_loss']:.4f}" if line else "–"
    ratio = f"{number(measured['perplexity'] / dense['perplexity'])}×" if line and dense else "–"
    record = measured["record"]
    return (
        f"| {label} | {line['removed_blocks'] if line else '–'} | {loss} | "
        f"{number(measured['perplexity'])} | "
        f"{ratio} | {measured['acc']:.3f} | {measured['acc_norm']:.3f} | {record['started'][11:16]}, "
        f"{record['wall_seconds'] / 60:.1f} min, {load_note(record)} |"
    )


def quality_section(found: Results) -> str | None:
    """``## SmolLM2-135M: held-out quality``."""
    dense = found.quality(MODEL)
    if dense is None:
        return None
    rows = [quality_row(found, "dense", MODEL, None, None)]
    for objective, search in found.quality_pairs():
        line, best = found.variant(objective, search), found.variant(objective, "best")
        if search == "best" and line["search"] in QUALITY_SEARCHES:
            continue  # already a row of its own
        label = f"{objective} / {line['search']}" + (" (best)" if line["name"] == best["name"] else "")
        rows.append(quality_row(found, label, line["name"], line, dense))
    rows = [row for row in rows if row is not None]
    if len(rows) == 1:
        return None  # dense alone compares with nothing
    settings = dense["settings"]
    windows = settings["perplexity"]
    records = [found.record(f"quality-{name}") for name in found.quality_names()]
    commands = [f"    {record['command']}" for record in records if record]
    intro = [
        QUALITY_TITLE,
        "",
        f"Held-out quality of the real model (`{MODEL}`, N = 30) and of the M = {DROP} variants that a "
        "fast search (one_shot) and LoRP found under each objective, and of the best one (the lowest "
        "calibration loss in the searches section). "
        f"*Perplexity*: pydoc's test split ({windows['windows']} windows × {windows['seq_len']} tokens, "
        f"{windows['tokens']:,} tokens scored), which no calibration, healing or cloze-calibration text "
        "shares; *cloze*: lm-eval's `acc` and `acc_norm` on the test split's LAMBADA-style cloze items "
        "(4 choices, chance 0.25). Engine: torch, float32. "
        f"{THREADS_NOTE} Measured on {dense['record']['started'][:10]} (UTC times; *run* is each eval "
        "command's start, wall time and 1-minute load average before → after).",
        "",
        "| model (objective / search) | removed blocks | calibration loss | pydoc test ppl | × dense | "
        "cloze acc | cloze acc_norm | run |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    return "\n".join(
        intro
        + rows
        + ["", *quality_reading(found)]
        + ["Commands (`python -m benchmarks.bench_real_model quality` runs them):", ""]
        + commands
    )


def broken_variants(found: Results) -> list[str]:
    """A sentence per measured variant whose held-out cloze accuracy is near chance (below 0.4; chance is
    0.25) although its calibration loss is below dense's: the objective rewarded a broken model."""
    sentences = []
    for objective in CALIBRATION:
        for line in found.variants(objective):
            measured = found.quality(line["name"])
            if measured is None or measured["acc"] >= 0.4 or line["calibration_loss"] >= line["dense_loss"]:
                continue
            sentences.append(
                f"**{objective} / {line['search']} is broken on held-out data** (cloze acc "
                f"{measured['acc']:.3f}, chance 0.25; perplexity {number(measured['perplexity'])}) although "
                f"its calibration loss ({line['calibration_loss']:.3f}) is below dense's "
                f"({line['dense_loss']:.3f}): it removes blocks {line['removed_blocks']}, and the task "
                "margin, a mean over the calibration questions of unbounded log-probability differences, "
                "can be raised by a model that is extremely confident on those few questions: most likely "
                "the search overfitted the calibration set, which held-out data exposes."
            )
    return sentences


def quality_reading(found: Results) -> list[str]:
    """Which variants were not measured, and per objective whether its best calibration loss also gave
    the lowest held-out perplexity of the variants measured."""
    missing = [
        f"{objective} / {found.variant(objective, search)['search']}"
        for objective, search in found.quality_pairs()
        if found.quality(found.variant(objective, search)["name"]) is None
    ]
    sentences = []
    for objective in CALIBRATION:
        measured = [
            (found.quality(line["name"])["perplexity"], line["search"])
            for line in found.variants(objective)
            if found.quality(line["name"]) is not None
        ]
        if len(measured) < 2:
            continue
        best = found.variant(objective, "best")["search"]
        lowest, by_search = min(measured), {search: value for value, search in measured}
        if best not in by_search:
            continue
        best_perplexity = by_search[best]
        verdict = (
            f"yes ({best}, {best_perplexity:.2f})"
            if lowest[1] == best
            else f"no: {best} {best_perplexity:.2f} against {lowest[1]} {lowest[0]:.2f}"
        )
        sentences.append(f"under {objective}, {verdict}")
    lines = [*broken_variants(found)]
    if sentences:
        lines.append(
            "Reading: does the lowest calibration loss give the lowest held-out perplexity of the variants "
            "measured? " + "; ".join(sentences) + "."
        )
    if missing:
        listed = ", ".join(dict.fromkeys(missing))
        lines.append(f"Not measured (the heavy-time budget of this session): {listed}.")
    return [paragraph for line in lines for paragraph in (line, "")]


def disagreement_note(record: dict) -> str:
    """A sentence when the fast and naive scores differ by more than the command's tolerance."""
    result = record["output"]
    if result["agree"]:
        return ""
    return (
        f" `{result['calibration']['objective']}`: the fast and naive scores differ by up to "
        f"{result['max_abs_difference']:.1e}, above the command's tolerance {result['tolerance']:.0e} "
        "(`agree: false`); likely float32 rounding, which differs between a question's choices packed into "
        "one sequence and run apart, accumulated over 30 blocks. It "
        "matters to a search only where two sets' scores are closer than that."
    )


def evaluator_section(found: Results) -> str | None:
    """``## SmolLM2-135M: subset evaluator``."""
    records = [found.record(f"evaluator-{objective}") for objective in CALIBRATION]
    records = [record for record in records if record]
    if not records:
        return None
    rows = []
    for record in records:
        result = record["output"]
        rows.append(
            f"| `{result['calibration']['objective']}` on `{result['calibration']['data']}` | "
            f"{result['fast_seconds']:.1f} | {result['naive_seconds']:.1f} | **{result['speedup']:.2f}×** | "
            f"{result['fast_block_forwards']:,} / {result['naive_block_forwards']:,} | "
            f"{result['fast_head_positions']:,} / {result['naive_head_positions']:,} | "
            f"{result['max_abs_difference']:.1e} ({'within' if result['agree'] else '**above**'} the "
            f"tolerance {result['tolerance']:.0e}) | {load_note(record)} |"
        )
    first = records[0]["output"]
    intro = [
        EVALUATOR_TITLE,
        "",
        f"`depthprune bench-evaluator` on the real model (`{MODEL}`, N = {first['num_blocks']}): every "
        f"single-block removal, then {first['sets'] - first['num_blocks']} random sets of M = "
        f"{first['budget']}, scored by the fast evaluator and by naive full forwards (the SLEB way); "
        + " and ".join(
            f"{r['output']['calibration']['samples']} {r['output']['calibration']['objective']} samples"
            for r in records
        )
        + f" × ≤{first['calibration']['seq_len']} tokens, batch "
        f"{first['batch_size']}, {first['dtype']}, {first['threads']} torch thread(s), one round each "
        f"(sized to finish in minutes here). Measured {records[0]['started']}.",
        "",
        "| objective / data | fast wall s | naive wall s | speedup | block-forwards fast / naive | "
        "LM-head positions fast / naive | max abs score difference | load |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    commands = [f"    {record['command']}" for record in records]
    missing = [objective for objective in CALIBRATION if found.record(f"evaluator-{objective}") is None]
    note = [
        "The samples are fewer than the searches use so that each objective fits in ten minutes of the "
        "shared machine; the block-forward and LM-head position ratios, which bound the speed-up, do not "
        "depend on the sample count. Times under load are noisy (one round each)."
        + (f" Not measured (the heavy-time budget of this session): {', '.join(missing)}." if missing else "")
        + "".join(disagreement_note(record) for record in records),
        "",
    ]
    return "\n".join(intro + rows + [""] + note + ["Commands:", ""] + commands)


def compute_ceiling(model_dir: str, removed: int, prompt_len: int, output_len: int) -> tuple[float, float]:
    """What the LM head leaves of the ideal, counting multiply-adds of one request of the load test.

    Args:
        model_dir: the dense checkpoint (its ``config.json``).
        removed: M, the blocks the variant lacks.
        prompt_len: prompt tokens per request (every block sees them; the LM head only the last).
        output_len: generated tokens per request (each through every block and the LM head).

    Returns:
        (the blocks' share of the LM head and blocks per generated token, the speed-up if time followed
        the request's multiply-adds; attention over the short context is left out).
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, blocks = config["hidden_size"], config["num_hidden_layers"]
    head_dim = hidden // config["num_attention_heads"]
    key_value = 2 * config["num_key_value_heads"] * head_dim
    per_block = hidden * (2 * hidden + key_value) + 3 * hidden * config["intermediate_size"]
    head = hidden * config["vocab_size"]

    def request(depth: int) -> int:
        return (prompt_len + output_len) * depth * per_block + output_len * head

    share = blocks * per_block / (blocks * per_block + head)
    return share, request(blocks) / request(blocks - removed)


def per_round_ratio(models: dict, name: str, baseline: str) -> list[float]:
    """Output throughput of ``name`` / ``baseline``, round by round (they ran back to back)."""
    return [
        mine["output_throughput"] / base["output_throughput"]
        for mine, base in zip(models[name]["rounds"], models[baseline]["rounds"])
    ]


def loadtest_rows(output: dict) -> list[str]:
    """One row per served model: per-round and median output throughput, speed-up and fractions of ideal."""
    rows = []
    for name, metrics in output["models"].items():
        rates = [one_round["output_throughput"] for one_round in metrics["rounds"]]
        blocks = (metrics.get("blocks") or {}).get("removed_blocks") or 0
        compared = output["comparison"].get(name)
        removed = output["summary"]["variants"].get(name, {}).get("removed_blocks", [])
        speedup = "1" if compared is None else f"**{compared['output_throughput_speedup']:.3f}**"
        ideal = "–" if compared is None else f"{compared['ideal_speedup']:.3f}"
        fraction = "–" if compared is None else f"**{compared['fraction_of_ideal_speedup']:.3f}**"
        gain = "–" if compared is None else f"{compared['fraction_of_ideal_gain']:.3f}"
        rows.append(
            f"| {name} | {removed or '–'} ({30 - blocks} blocks) | {', '.join(f'{r:.0f}' for r in rates)} | "
            f"{statistics.median(rates):.0f} | {speedup} | {ideal} | {fraction} | {gain} |"
        )
    return rows


def loadtest_reading(output: dict) -> str:
    """The goal, the speed-up against what multiply-adds alone would allow, and healed against unhealed."""
    summary = output["summary"]
    pruned = LOADTEST_NAMES["pruned"]
    settings = summary["settings"]
    share, ceiling = compute_ceiling(
        summary["model"], len(summary["removed_blocks"]), settings["input_len"], settings["output_len"]
    )
    ideal, speedup = summary["ideal_speedup"], summary["loadtest_speedup"]
    goal = "**met**" if summary["goal_fraction_met"] else "**not met**"
    why = (
        "most likely because time does not follow multiply-adds (the LM head is one large matrix product, "
        "while each block is "
        "many small operations (norms, rotary embedding, attention over the KV cache, activations) whose "
        "per-call cost in eager mode also goes with the blocks removed)"
        if speedup > ceiling
        else "the rest is per-step work that does not shrink with depth either (vLLM's scheduler, sampling "
        "and detokenisation in Python, the gateway and the load client on the same 2 cores)"
    )
    text = (
        f"Goal (≥ {summary['target_fraction']} of the ideal N/(N−M) = 30/22 = {ideal:.3f}): {goal}, "
        f"{summary['fraction_of_ideal_speedup']:.3f} (speed-up {speedup:.3f}). For reference, the tied LM "
        "head (576 × 49,152) is as large as about eight blocks and does not shrink (the blocks hold "
        f"{100 * share:.0f} % of a generated token's multiply-adds); counting a request's multiply-adds "
        f"(every block on {settings['input_len']} prompt + {settings['output_len']} generated tokens, the LM "
        f"head on the generated ones) would cap the speed-up at {ceiling:.3f} ({ceiling / ideal:.3f} of the "
        f"ideal). The measured one is {'above' if speedup > ceiling else 'below'} that cap: {why}."
    )
    healed = [name for name in output["models"] if name not in ("dense", pruned)]
    for name in healed:
        ratios = per_round_ratio(output["models"], name, pruned)
        spread = max(abs(ratio - 1) for ratio in ratios)
        text += (
            f" Healed against unhealed: {name} / {pruned} = **{geometric_mean(ratios):.3f}** (per round "
            f"{', '.join(f'{r:.3f}' for r in ratios)}): equal within the round-to-round noise "
            f"(±{100 * spread:.1f} %), as it must be: healing merges its adapters into the same shapes, so "
            "the served model does the same work."
        )
    return text


def loadtest_section(found: Results) -> str | None:
    """``## SmolLM2-135M: load test``."""
    record = found.record("loadtest")
    if record is None:
        return None
    output = record["output"]
    settings = output["summary"]["settings"]
    intro = [
        LOADTEST_TITLE,
        "",
        f"The real model (`{MODEL}`, N = 30) against its M = {DROP} variant (`{LOADTEST_NAMES['pruned']}`: "
        "the perplexity objective's best, the heal parent) and that variant healed with LoRA, served side by "
        "side in one run: one vLLM CPU engine per model (eager, `--max-model-len 512`, float32, as "
        "`make demo` serves a real model), the gateway (`depthprune serve`) in front, every model measured "
        f"at saturation ({settings['num_prompts']} requests at once, ≤ {settings['input_len']} prompt tokens "
        f"of pydoc's test split + {settings['output_len']} generated, `ignore_eos`) in each of "
        f"{settings['rounds']} rounds, the models' order alternating between rounds. Speed-ups are geometric "
        "means of per-round ratios to dense (models measured back to back). "
        f"Run {record['started']}, {record['wall_seconds'] / 60:.1f} min with the engines' start, "
        f"{load_note(record)}"
        + (
            ": the other heavy slot of the 2 cores was busy, so absolute rates are low and noisy; "
            "the ratios are what to read."
            if max(record["load_before"][0], record["load_after"][0]) > BUSY_LOAD
            else "."
        ),
        "",
        "| model | removed blocks | output tok/s per round | median tok/s | speed-up vs dense | ideal | "
        "fraction of ideal speed-up | fraction of ideal gain |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    command = [
        "",
        "Command (`python -m benchmarks.bench_real_model loadtest` runs it):",
        "",
        f"    {record['command']}",
    ]
    return "\n".join(intro + loadtest_rows(output) + ["", loadtest_reading(output)] + command)


def healed_throughput(found: Results, objective: str, method: str) -> str:
    """Output throughput of the healed variant / its unhealed parent in the load test's run, or ``–``."""
    record = found.record("loadtest")
    name = LOADTEST_NAMES[method]
    if objective != "perplexity" or record is None or name not in record["output"]["models"]:
        return "–"
    return (
        f"{geometric_mean(per_round_ratio(record['output']['models'], name, LOADTEST_NAMES['pruned'])):.3f}"
    )


def healing_rows(found: Results, objective: str, dense: dict) -> list[str]:
    """The pruned variant of ``objective`` and its healed children (empty when none was evaluated): quality,
    gap recovered, wall time, throughput against the unhealed variant."""
    parent = found.variant(objective, HEAL_SEARCH)
    pruned = found.quality(parent["name"])
    if pruned is None:
        return []
    gap = pruned["perplexity"] - dense["perplexity"]
    rows = []
    for method in HEAL_METHODS:
        record = found.record(f"heal-{objective}-{method}")
        healed = found.quality(heal_outcome(record)["name"]) if record else None
        if healed is None:
            continue
        outcome = heal_outcome(record)
        losses = outcome["losses"]
        recovered = (pruned["perplexity"] - healed["perplexity"]) / gap
        rows.append(
            f"| {objective} / {parent['search']} + **{method}** | {outcome['steps']} | "
            f"{losses['heldout_before']:.2f} → {losses['heldout']:.2f} | {healed['perplexity']:.2f} | "
            f"**{recovered:.2f}** | {healed['acc']:.3f} | {healed['acc_norm']:.3f} | "
            f"{outcome['wall_seconds'] / 60:.1f} | {healed_throughput(found, objective, method)} | "
            f"{load_note(record)} |"
        )
    if not rows:
        return []
    pruned_row = (
        f"| {objective} / {parent['search']} (pruned; {parent['removed_blocks']}) | – | – | "
        f"{pruned['perplexity']:.2f} | 0 | {pruned['acc']:.3f} | {pruned['acc_norm']:.3f} | – | 1 | |"
    )
    return [pruned_row, *rows]


def healing_reading(found: Results, dense: dict) -> list[str]:
    """Per healed variant: the gap recovered and the wall time against the goals (≥ 0.5, ≤ 15 min)."""
    sentences = []
    for objective in CALIBRATION:
        parent = found.variant(objective, HEAL_SEARCH) if found.variants(objective) else None
        pruned = found.quality(parent["name"]) if parent else None
        for method in HEAL_METHODS:
            record = found.record(f"heal-{objective}-{method}")
            healed = found.quality(heal_outcome(record)["name"]) if record and pruned else None
            if healed is None:
                continue
            recovered = (pruned["perplexity"] - healed["perplexity"]) / (
                pruned["perplexity"] - dense["perplexity"]
            )
            minutes = heal_outcome(record)["wall_seconds"] / 60
            met = "both goals met" if recovered >= 0.5 and minutes <= 15 else "goals NOT both met"
            sentences.append(
                f"{objective} + {method}: {recovered:.2f} of the gap in {minutes:.1f} min ({met}; cloze acc "
                f"{pruned['acc']:.3f} → {healed['acc']:.3f}, dense {dense['acc']:.3f})"
            )
    return ["Reading: " + "; ".join(sentences) + ".", ""] if sentences else []


def not_healed_note(found: Results, objective: str) -> str:
    """Why the objective's best variant has no healed rows."""
    ran = found.variants(objective)
    quality = found.quality(found.variant(objective, HEAL_SEARCH)["name"]) if ran else None
    broken = (
        f" It is broken on held-out data (cloze acc {quality['acc']:.3f}; see the held-out quality section)."
        if quality and quality["acc"] < 0.4
        else ""
    )
    return f"Not healed here: {objective}'s best variant (the heavy-time budget of this session).{broken}"


def healing_section(found: Results) -> str | None:
    """``## SmolLM2-135M: healing``."""
    dense = found.quality(MODEL)
    if dense is None:
        return None
    healed = [objective for objective in CALIBRATION if found.variants(objective)]
    rows = {objective: healing_rows(found, objective, dense) for objective in healed}
    if not any(rows.values()):
        return None
    records = [
        found.record(f"heal-{objective}-{method}") for objective in CALIBRATION for method in HEAL_METHODS
    ]
    commands = [f"    {record['command']}" for record in records if record]
    missing = [objective for objective in CALIBRATION if not rows.get(objective)]
    intro = [
        HEALING_TITLE,
        "",
        "The best variant (the lowest calibration loss of the searches above; M = "
        f"{DROP} of 30) healed on pydoc's heal split (18 topics, 28.5 K tokens, disjoint from the "
        "calibration and test splits; batches of 4 × 128 tokens, lr 1e-3; LoRA on the causal-LM loss, "
        "distill on the KL divergence from the dense model's top-k next-token distribution), then "
        "evaluated as in the held-out quality section. *Held-out loss*: the heal command's own, on 16 "
        "windows of pydoc's test split, before → after. *Gap recovered* = (ppl pruned − ppl healed) / "
        f"(ppl pruned − ppl dense), on the pydoc test perplexity (dense {dense['perplexity']:.2f}, cloze acc "
        f"{dense['acc']:.3f}). *Wall min* is the heal command's own (training, the held-out loss before and "
        "after, merge and write). *Throughput vs unhealed*: output tok/s of the healed variant over its "
        "parent's in the SmolLM2-135M load test (one run, geometric mean of per-round ratios). Goals: at "
        "least half of the gap recovered, at most 15 minutes per variant. " + THREADS_NOTE,
        "",
        "| variant | steps | held-out loss | pydoc test ppl | gap recovered | cloze acc | cloze acc_norm | "
        "wall min | throughput vs unhealed | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
        f"| dense | – | – | {dense['perplexity']:.2f} | 1 | {dense['acc']:.3f} | {dense['acc_norm']:.3f} | "
        "– | – | |",
    ]
    skipped = [not_healed_note(found, objective) for objective in missing]
    return "\n".join(
        intro
        + [row for objective in healed for row in rows[objective]]
        + [""]
        + healing_reading(found, dense)
        + skipped
        + ["", f"Commands (each healed variant then `depthprune eval NAME {' '.join(EVAL_FLAGS)}`):", ""]
        + commands
    )


def write(results: Path, no_write: bool) -> None:
    """Compose every section whose records exist; write them into docs/benchmarks.md unless ``no_write``."""
    found = Results(results)
    for title, compose in SECTIONS:
        text = compose(found)
        if text is None:
            continue
        print(text + "\n")
        if not no_write:
            write_section(title, text)


SECTIONS = (
    (QUALITY_TITLE, quality_section),
    (SEARCHES_TITLE, searches_section),
    (EVALUATOR_TITLE, evaluator_section),
    (LOADTEST_TITLE, loadtest_section),
    (HEALING_TITLE, healing_section),
)
"""Docs sections, in the order they are written (each only once its records exist)."""
