"""The demo's load test: its prompts (held-out text), the arms and rounds it announces, and the
``depthprune loadtest`` command it runs against the gateway (the decision rule, or ``--precise``'s ±2 %)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ground.core.errors import UserError

AA_TOLERANCE = 0.05
"""The decision rule's bound on the A/A interval: within [1/1.05, 1.05]."""


def load_test_prompts(plan, out: Path) -> str:
    """``--prompts`` of the load test: the demo model's test text, or the pydoc test split written as JSONL.

    Held-out text either way: the load test's prompts are never calibration data.
    """
    if plan.is_demo_model:
        return "demo"
    from pruning.calibration.data.pydoc import pydoc_documents

    path = out / "prompts-pydoc-test.jsonl"
    lines = [json.dumps({"text": document.text}) for document in pydoc_documents("test")]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def load_test(config, plan, url: str, served: list[str], model_dir: Path | str, say) -> dict:
    """Run ``depthprune loadtest`` against the gateway; returns the saved result (``config`` and ``plan``: the
    demo's; ``say``: its step heading)."""
    from loadtest.order import block_rounds
    from loadtest.precision import round_limits

    sizes = plan.sizes
    max_rounds = max(sizes.rounds, sizes.max_rounds)
    # the served arms and dense's A/A arm run in balanced blocks, as the load test's stop rule counts them
    fewest, most = round_limits(sizes.rounds, max_rounds, block_rounds(len(served) + 1))
    rounds = f"{fewest}" if most == fewest else f"{fewest}-{most}"
    say(
        config,
        f"load test of {', '.join(served)} and dense's A/A arm: {rounds} interleaved rounds of "
        f"{sizes.num_prompts} requests x {sizes.output_len} tokens per model, all at once",
    )
    result_path = config.out / "loadtest.json"
    command = [sys.executable, "-m", "depthprune", "loadtest", "--target", url, "--models", ",".join(served)]
    command += ["--num-prompts", str(sizes.num_prompts), "--input-len", str(sizes.input_len)]
    command += ["--output-len", str(sizes.output_len), "--rounds", str(sizes.rounds)]
    # The A/A control always; rounds until the stop rule (decided, or ±2 % with --precise) or the budget;
    # saturation only (a steady-state phase would double the time).
    command += [
        "--aa",
        "--max-rounds",
        str(max_rounds),
        "--target-precision",
        "0.02",
    ]
    command += ["--stop-rule", sizes.stop_rule, "--aa-tolerance", str(AA_TOLERANCE)]
    # The demo's promise is a time: once --rounds ran, the budget ends the test even inside a block.
    command += ["--time-budget", str(sizes.load_budget_s), "--budget-cuts-blocks", "--steady-fraction", "0"]
    command += ["--rate", "inf", "--warmup", "2", "--prompts", load_test_prompts(plan, config.out)]
    command += ["--tokenizer", str(model_dir), "--save-result", str(result_path)]
    command += ["--report-dir", str(config.out / "loadtest")]
    if config.registry_url:
        command += ["--registry", config.registry_url]
    completed = subprocess.run(command, stdout=subprocess.DEVNULL, text=True)
    if completed.returncode != 0:
        raise UserError(f"the load test failed (exit {completed.returncode}); see the messages above")
    result = json.loads(result_path.read_text())
    say(config, f"load test: {result.get('rounds')} rounds, {stop_reason(result)}")
    return result


def stop_reason(result: dict) -> str:
    """Which rule ended the load test, in words: decided, precise enough, out of rounds, or out of time."""
    reason = (result.get("precision") or {}).get("stop_reason")
    return f"stopped: {reason}" if reason else "stopped at its fewest rounds"
