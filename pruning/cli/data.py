"""``depthprune data``: look at calibration data before paying for a search.

``depthprune data show SPEC --model M [--samples K] [--seq-len L] [--data-seed S]
[--sampling documents|stream] [--json]`` draws the instances a pruning run with the same settings would
draw and prints them as the objective sees them (:mod:`pruning.calibration.objectives.show`): with ``--json``
one JSON object per line (``text``, or ``context``, ``choices``, ``label`` and the scored strings); otherwise
a readable listing. Only the model's tokenizer is loaded, never its weights.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ground.core.cli_options import with_options
from ground.core.options import JsonOptions
from pruning.cli.options import DataShowOptions, SamplingOptions

app = typer.Typer(
    name="data",
    help="Look at calibration data: the instances exactly as the objective sees them.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_readable(instances: list[dict]) -> None:
    for number, instance in enumerate(instances):
        if "text" in instance:
            document = "" if instance["document"] is None else f", document {instance['document']}"
            print(f"--- instance {number} ({instance['tokens']} tokens{document})")
            print(instance["text"])
            continue
        print(f"--- item {number} (label {instance['label']}, scoring {instance['scoring']})")
        for index, scored in enumerate(instance["scored"]):
            mark = "*" if index == instance["label"] else " "
            print(f"[{mark}] {scored['prompt']}⟦{scored['answer']}⟧")


@app.command("show")
@with_options
def show(
    spec: Annotated[
        str,
        typer.Argument(
            help="Data spec: c4, wikitext2, lambada, commonsense170k[:PATH], pydoc, pydoc-cloze, demo:text, "
            "demo:qa, text:PATH or mc:PATH."
        ),
    ],
    options: DataShowOptions,
    sampling_options: SamplingOptions,
    output: JsonOptions,
) -> None:
    """Print the calibration instances of SPEC exactly as the objective will see them.

    The ``⟦…⟧`` brackets of the readable listing mark the tokens a choice is scored on; ``*`` the correct one.
    """
    from transformers import AutoTokenizer

    from ground.core.errors import UserError
    from pruning.calibration.data.items import SAMPLINGS
    from pruning.calibration.objectives.show import show_instances
    from pruning.pipeline.prune import canonical_model

    samples, seq_len, data_seed = options.samples, options.seq_len, options.data_seed
    sampling, model = sampling_options.sampling, options.model
    if sampling not in SAMPLINGS:
        raise UserError(f"unknown --sampling {sampling!r}; use one of {', '.join(SAMPLINGS)}")
    for name, value, lowest in (
        ("--samples", samples, 1),
        ("--seq-len", seq_len, 2),
        ("--data-seed", data_seed, 0),
    ):
        if value < lowest:
            raise UserError(f"{name} must be at least {lowest}, got {value}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(canonical_model(model))
    except OSError as error:  # not a model directory, an unknown hub id, or offline
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UserError(f"cannot load the tokenizer of {model!r}: {first}") from None
    shown = show_instances(spec, tokenizer, samples, seq_len, data_seed, sampling, options.split)
    print(shown.summary, file=sys.stderr)
    if output.as_json:
        for instance in shown.instances:
            print(json.dumps(instance, ensure_ascii=False))
    else:
        _print_readable(shown.instances)
