"""Commonsense-170k: option texts parsed per sub-task, and scored as PuDDing scores them.

The rows are hand-written in each sub-task's published format (LLM-Adapters' ``dataset/*/train.json`` and
``ft-training_set/commonsense_170k.json``: the preface, the option markers and their separators, the
``Answer format`` line, the ``output``), so a change of the parser is checked against the real layout.
"""

from __future__ import annotations

import pytest
import torch

from pruning.calibration.data.commonsense import parse_commonsense_row, subtask_of
from pruning.calibration.data.items import ChoiceItem, ChoiceSamples
from pruning.calibration.objectives import OBJECTIVES, loss_of
from pruning.calibration.objectives.batches import encode_choice, make_batches


def row(instruction: str, answer: str) -> dict:
    return {
        "instruction": instruction,
        "input": "",
        "output": f"the correct answer is {answer}",
        "answer": answer,
    }


# (sub-task, row, question, option texts, label, scoring)
CASES = [
    (
        "boolq",
        row(
            "Please answer the following question with true or false, question: is a tomato a fruit?"
            "\n\nAnswer format: true/false",
            "true",
        ),
        "is a tomato a fruit?",
        ("True", "False"),
        0,
        "answer",
    ),
    (
        "piqa",
        row(
            "Please choose the correct solution to the question: Keep bread fresh longer."
            "\n\nSolution1: Store it in a sealed bag in a cool place."
            "\n\nSolution2: Store it in a sealed bag on a hot radiator."
            "\n\nAnswer format: solution1/solution2",
            "solution1",
        ),
        "Keep bread fresh longer.",
        ("Store it in a sealed bag in a cool place.", "Store it in a sealed bag on a hot radiator."),
        0,
        "answer",
    ),
    (
        "siqa",
        row(
            "Please choose the correct answer to the question: Kim lent Alex a pen before the exam. "
            "How would Alex feel as a result?"
            "\n\nAnswer1: grateful to Kim Answer2: angry at the exam Answer3: sleepy"
            "\n\nAnswer format: answer1/answer2/answer3",
            "answer1",
        ),
        "Kim lent Alex a pen before the exam. How would Alex feel as a result?",
        ("grateful to Kim", "angry at the exam", "sleepy"),
        0,
        "answer",
    ),
    (
        "hellaswag",
        row(
            "Please choose the correct ending to complete the given sentence: Baking cookies: "
            "A woman mixes butter and sugar in a bowl. She"
            "\n\nEnding1: paints the bowl blue. Ending2: adds flour and stirs the dough. "
            "Ending3: swims across the lake. Ending4: reads the newspaper aloud."
            "\n\nAnswer format: ending1/ending2/ending3/ending4",
            "ending2",
        ),
        "Baking cookies: A woman mixes butter and sugar in a bowl. She",
        (
            "paints the bowl blue.",
            "adds flour and stirs the dough.",
            "swims across the lake.",
            "reads the newspaper aloud.",
        ),
        1,
        "answer",
    ),
    (
        "winogrande",
        row(
            "Please choose the correct answer to fill in the blank to complete the given sentence: "
            "The trophy did not fit in the suitcase because the _ was too small."
            "\n\nOption1: trophy Option2: suitcase Answer format: option1/option2",
            "option2",
        ),
        "The trophy did not fit in the suitcase because the _ was too small.",
        ("trophy", "suitcase"),
        1,
        "sentence",
    ),
    (
        "arc",
        row(
            "Please choose the correct answer to the question: Which of these is a source of light?"
            "\n\nAnswer1: the Moon Answer2: the Sun Answer3: a mirror Answer4: a window Answer5: a rock"
            "\n\nAnswer format: answer1/answer2/answer3/answer4/answer5",
            "answer2",
        ),
        "Which of these is a source of light?",
        ("the Moon", "the Sun", "a mirror", "a window", "a rock"),
        1,
        "answer",
    ),
    (
        "obqa",
        row(
            "Please choose the correct answer to the question: A magnet will stick to"
            "\n\nAnswer1: a wooden door Answer2: a glass cup Answer3: an iron nail Answer4: a paper bag"
            "\n\nAnswer format: answer1/answer2/answer3/answer4",
            "answer3",
        ),
        "A magnet will stick to",
        ("a wooden door", "a glass cup", "an iron nail", "a paper bag"),
        2,
        "answer",
    ),
]


@pytest.mark.parametrize("subtask, row_, question, choices, label, scoring", CASES, ids=[c[0] for c in CASES])
def test_each_subtask_parses_to_question_option_texts_and_label(
    subtask, row_, question, choices, label, scoring
):
    item = parse_commonsense_row(row_)
    assert item == ChoiceItem(question, choices, label, scoring)
    # no choice is a label word, so no two choices share their first token by construction
    assert not any(
        choice.lower().startswith(("option", "ending", "answer", "solution")) for choice in choices
    )


def test_subtask_names():
    assert subtask_of(("true", "false")) == "boolq"
    assert subtask_of(("solution1", "solution2")) == "piqa"
    assert subtask_of(("answer1", "answer2", "answer3")) == "siqa/arc/obqa"
    assert subtask_of(("ending1", "ending2", "ending3", "ending4")) == "hellaswag"
    assert subtask_of(("option1", "option2")) == "winogrande"


def test_prompts_are_puddings():
    """The scored strings: ``Question: {q}\\nAnswer: {text}`` (answer tokens only), or the filled sentence."""
    tokenizer = CharacterTokenizer()
    items = {case[0]: parse_commonsense_row(case[1]) for case in CASES}
    ids, start, _ = encode_choice(tokenizer, items["piqa"].context, items["piqa"].choices[0], 512)
    assert tokenizer.decode(ids[:start]) == "Question: Keep bread fresh longer.\nAnswer:"
    assert tokenizer.decode(ids[start:]) == " Store it in a sealed bag in a cool place."
    wino = items["winogrande"]
    ids, start, _ = encode_choice(tokenizer, wino.context, wino.choices[1], 512, wino.scoring)
    assert start == 1
    assert (
        tokenizer.decode(ids) == "The trophy did not fit in the suitcase because the suitcase was too small."
    )


class CharacterTokenizer:
    """One token per character (its code point), so decoding gives back the exact string."""

    def __call__(self, text: str, add_special_tokens: bool = True, **_) -> dict:
        return {"input_ids": [ord(character) for character in text]}

    def decode(self, ids) -> str:
        return "".join(map(chr, ids))


# ---------------------------------------------------------------- the margin of fill-in-the-blank items


def sentence_logprob(model, tokenizer, sentence):
    """PuDDing's WinoGrande ℓ: mean log-prob of every token of the sentence after the first."""
    ids = tokenizer(sentence)["input_ids"]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0], dim=-1)
    return sum(logprobs[t - 1, ids[t]] for t in range(1, len(ids))) / (len(ids) - 1)


def test_sentence_items_margin_by_hand():
    from depthprune.testing.models import tiny_model, tiny_tokenizer
    from pruning.model.blocks import BlockStack

    model, tokenizer = tiny_model("llama", seed=1), tiny_tokenizer()
    items = [
        ChoiceItem("w10 w11 _ w12 w13", ("w20", "w21 w22"), 1, "sentence"),
        ChoiceItem("w30 _ w31", ("w40", "w41", "w42"), 0, "sentence"),
        ChoiceItem("w50 w51", ("w60", "w61"), 1),  # an answer-scored item in the same batch
    ]
    expected = []
    for item in items[:2]:
        scores = [sentence_logprob(model, tokenizer, item.context.replace("_", c)) for c in item.choices]
        expected.append(-sum(scores[item.label] - s for j, s in enumerate(scores) if j != item.label))
    (batch,) = make_batches(ChoiceSamples(items, "hand-made"), tokenizer, 64, batch_size=16)
    stack = BlockStack(model)
    with torch.no_grad():
        prepared = stack.prepare(batch.input_ids)
        hidden = stack.run_blocks(prepared.hidden, prepared, stack.kept_blocks(()))
        losses = loss_of(OBJECTIVES["task_margin"])(batch, hidden, stack.head, None)
    torch.testing.assert_close(losses[:2], torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_sentence_items_packed_equal_per_choice_and_naive(tiny_model_dirs, tmp_path):
    """Fill-in-the-blank choices share the sentence up to the blank: packing them stays exact."""
    from depthprune.testing.data import write_jsonl
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.scoring.build import build_evaluator

    rows = [
        {
            "context": "w10 w11 w12 _ w13 w14",
            "choices": ["w20", "w21 w22"],
            "label": 1,
            "scoring": "sentence",
        },
        {"context": "_ w30 w31", "choices": ["w40", "w41"], "label": 0, "scoring": "sentence"},
        {"context": "w50 w51 _", "choices": ["w60", "w61", "w62"], "label": 2, "scoring": "sentence"},
        {"context": "w70 w71", "choices": ["w72", "w73 w74"], "label": 1},
    ]
    config = CalibrationConfig(
        "task_margin", f"mc:{write_jsonl(tmp_path / 'q.jsonl', rows)}", samples=4, seq_len=32
    )
    model = str(tiny_model_dirs("llama"))
    packed = build_evaluator(model, config, progress=False, batch_size=8)
    per_choice = build_evaluator(model, config, progress=False, batch_size=8, pack_choices=False)
    naive = build_evaluator(model, config, progress=False, batch_size=8, naive=True)
    assert packed.packed
    for removed in (frozenset(), frozenset({1, 4}), frozenset({0, 5})):
        assert packed.score(removed) == pytest.approx(per_choice.score(removed), abs=1e-5)
        assert packed.score(removed) == pytest.approx(naive.score(removed), abs=1e-5)
