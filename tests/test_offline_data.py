"""The offline real data: ``pydoc`` text and ``pydoc-cloze`` items from Python's own documentation.

Splits disjoint and independent of the interpreter's ordering, every cloze answer the passage's true next
word, distractors from the same split, the specs wired into ``data``, and the ``offline`` evaluation suite
on a tiny model whose tokenizer knows the documentation's words.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from ground.core.errors import UserError
from pruning.calibration import data
from pruning.calibration.data import pydoc as pydoc_source
from pruning.calibration.data.pydoc import PYDOC_SPLITS


def collapsed(text: str) -> str:
    return " ".join(text.split())


def paragraphs_by_split() -> dict[str, set[str]]:
    return {
        split: {
            collapsed(paragraph)
            for document in pydoc_source.pydoc_documents(split)
            for paragraph in re.split(r"\n\s*\n", document.text)
            if paragraph.strip()
        }
        for split in PYDOC_SPLITS
    }


def clear_caches():
    pydoc_source._all_documents.cache_clear()
    pydoc_source._cloze_items.cache_clear()


# ----------------------------------------------------------------------------------------------- splits


def test_splits_are_disjoint_and_cover_every_kept_topic():
    topics = {split: {d.topic for d in pydoc_source.pydoc_documents(split)} for split in PYDOC_SPLITS}
    assert all(topics.values())
    for first, second in (("calibration", "heal"), ("calibration", "test"), ("heal", "test")):
        assert not topics[first] & topics[second]
    assert set().union(*topics.values()) == set(pydoc_source.owned_paragraphs(pydoc_source.pydoc_topics()))
    paragraphs = paragraphs_by_split()
    for first, second in (("calibration", "heal"), ("calibration", "test"), ("heal", "test")):
        assert not paragraphs[first] & paragraphs[second], f"{first} and {second} share a paragraph"
    for split, names in topics.items():
        assert all(pydoc_source.topic_split(name) == split for name in names)


def test_topics_contained_in_others_are_deduplicated():
    topics = {
        "chapter": "Title\n\nShared paragraph one.\n\nOwn text of the chapter.\n\nShared paragraph two.",
        "section": "Shared   paragraph\none.\n\nOwn text of the section.",
        "copy": "Shared paragraph two.",
    }
    kept = pydoc_source.owned_paragraphs(topics)
    assert kept == {
        "chapter": ["Title", "Shared paragraph one.", "Own text of the chapter.", "Shared paragraph two."],
        "section": ["Own text of the section."],
    }


def test_splits_do_not_depend_on_the_interpreters_order(monkeypatch):
    def snapshot():
        clear_caches()
        return [(pydoc_source.pydoc_documents(s), pydoc_source.cloze_items(s)) for s in PYDOC_SPLITS]

    in_order = snapshot()
    topics = pydoc_source.pydoc_topics()
    # The same topics in the opposite dict order, as another Python version might list them.
    monkeypatch.setattr(pydoc_source, "pydoc_topics", lambda: dict(reversed(list(topics.items()))))
    try:
        assert snapshot() == in_order
    finally:
        clear_caches()


def test_topic_split_is_a_fixed_hash_of_the_name():
    # Pinned: these must never move, whatever the Python version (changing them changes every split).
    assert [pydoc_source.topic_split(name) for name in ("assert", "compound", "specialnames", "with")] == [
        "calibration",
        "heal",
        "test",
        "calibration",
    ]
    assert pydoc_source.topic_split("a topic no Python has") in PYDOC_SPLITS


def test_documents_are_bounded_and_each_split_is_usable():
    counts = pydoc_source.split_counts()
    total = sum(count["characters"] for count in counts.values())
    for split, count in counts.items():
        assert count["characters"] >= 0.2 * total, (split, count)
        assert count["cloze_items"] >= 100, (split, count)
    for document in pydoc_source.pydoc_documents("heal"):
        single_paragraph = "\n\n" not in document.text
        assert len(document.text) <= pydoc_source.MAX_DOCUMENT_CHARS or single_paragraph
    ids = [d.document_id for split in PYDOC_SPLITS for d in pydoc_source.pydoc_documents(split)]
    assert len(ids) == len(set(ids))


# ------------------------------------------------------------------------------------------------ cloze


def test_paragraph_passages_cut_right_before_the_final_word():
    paragraph = (
        "The interpreter reads the whole file before it runs any of it. A syntax error anywhere\n"
        "stops it early, e.g. before the first line runs. Nothing is printed then, and the\n"
        'error names the line. It is found at once. And this one ends in code like "x". Then\n'
        "a last sentence of enough words follows it so that a second passage can end here."
    )
    assert pydoc_source.paragraph_passages(paragraph) == [
        (
            "The interpreter reads the whole file before it runs any of it. A syntax error anywhere stops "
            "it early, e.g. before the first line",
            "runs",
        ),
        (
            "Nothing is printed then, and the error names the line. It is found at once. And this one ends "
            'in code like "x". Then a last sentence of enough words follows it so that a second passage can '
            "end",
            "here",
        ),
    ]
    assert pydoc_source.paragraph_passages("Too short to be a passage at all.") == []


def test_every_cloze_answer_is_the_true_next_word_of_its_split():
    for split in PYDOC_SPLITS:
        texts = [collapsed(document.text) for document in pydoc_source.pydoc_documents(split)]
        for item in pydoc_source.cloze_items(split):
            answer = item.choices[item.label]
            assert re.fullmatch(r"[A-Za-z]{3,}", answer)
            assert any(f"{item.context} {answer}." in text for text in texts), (split, item.context[-80:])


def test_distractors_differ_and_come_from_the_same_split():
    answers = {}
    for split in PYDOC_SPLITS:
        answers[split] = {p.answer for p in pydoc_source.cloze_passages(split)}
    for split in PYDOC_SPLITS:
        items = pydoc_source.cloze_items(split)
        labels = Counter(item.label for item in items)
        assert set(labels) == {0, 1, 2, 3} and max(labels.values()) < 0.4 * len(items)  # order shuffled
        for item in items:
            answer = item.choices[item.label]
            assert len(item.choices) == 4 and len({choice.lower() for choice in item.choices}) == 4
            distractors = [choice for index, choice in enumerate(item.choices) if index != item.label]
            assert all(choice in answers[split] for choice in distractors)
            assert all(choice.islower() == answer.islower() for choice in distractors)


def test_cloze_contexts_never_repeat_across_splits():
    contexts = {split: {item.context for item in pydoc_source.cloze_items(split)} for split in PYDOC_SPLITS}
    assert not contexts["calibration"] & contexts["test"]
    assert not contexts["heal"] & contexts["test"]
    assert not contexts["calibration"] & contexts["heal"]


def test_pick_distractors_prefers_same_shape_and_length():
    import random

    pool = ["apple", "Berry", "cherry", "date", "elderberry", "fig", "grape", "kiwi", "lemon"]
    picked = pydoc_source.pick_distractors("mango", pool, random.Random(0))
    assert len(picked) == 3 and "Berry" not in picked and "elderberry" not in picked
    assert pydoc_source.pick_distractors("Mango", pool, random.Random(0)) == ["Berry"]


# ------------------------------------------------------------------------------------------------ specs


def test_specs_and_kinds():
    assert data.parse_spec("pydoc") == data.DataSpec("pydoc", "pydoc", data.TEXT)
    assert data.spec_kind("pydoc-cloze") == data.MULTIPLE_CHOICE
    assert "heal" in data.SPLITS and {"calibration", "test"} <= set(data.SPLITS)
    for split in PYDOC_SPLITS:
        documents = data.load_documents("pydoc", split)
        assert documents == [d.text for d in pydoc_source.pydoc_documents(split)]
        assert data.load_choice_items("pydoc-cloze", split) == pydoc_source.cloze_items(split)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: data.load_documents("pydoc", "train"), "unknown split 'train'"),
        (lambda: data.load_documents("c4", "heal"), "has no 'heal' split"),
        (lambda: data.load_choice_items("demo:qa", "heal"), "has no 'heal' split"),
        (lambda: data.load_documents("pydoc@/x"), "takes no '@PATH'"),
        (lambda: data.load_documents("pydoc-cloze"), "multiple-choice, not text"),
        (lambda: data.load_choice_items("pydoc"), "text, not multiple-choice"),
        (lambda: data.parse_spec("pydocs"), "unknown data spec"),
        (lambda: pydoc_source.cloze_items("validation"), "unknown split 'validation'"),
    ],
)
def test_bad_spec_or_split_is_one_line(call, message):
    with pytest.raises(UserError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_missing_pydoc_data_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # as a Python without pydoc_data
    clear_caches()
    try:
        with pytest.raises(UserError, match="no pydoc_data module") as error:
            data.load_documents("pydoc", "test")
        assert "\n" not in str(error.value)
    finally:
        clear_caches()


def test_local_files_have_a_heal_split(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("one document\n\nanother")
    assert data.load_documents(f"text:{text}", "heal") == ["one document", "another"]


def test_samples_are_deterministic():
    from depthprune.testing.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    first = data.load_samples("pydoc", tokenizer, samples=8, seq_len=64, seed=1)
    assert first.input_ids == data.load_samples("pydoc", tokenizer, samples=8, seq_len=64, seed=1).input_ids
    questions = data.load_samples("pydoc-cloze", tokenizer, samples=16, seq_len=64, seed=1, split="heal")
    assert len(questions.items) == 16 and set(questions.items) <= set(pydoc_source.cloze_items("heal"))


# ------------------------------------------------------------------------------ the offline suite, tiny


@pytest.fixture(scope="module")
def pydoc_model(tmp_path_factory):
    """A tiny random llama whose word-level tokenizer knows the test split's commonest words and the
    choices of its first cloze items (so the choices get distinct ids and the accuracy means something)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from depthprune.testing.models import save_tiny_model

    directory = save_tiny_model("llama", tmp_path_factory.mktemp("pydoc-model"))
    required = [choice for item in pydoc_source.cloze_items("test")[:8] for choice in item.choices]
    frequent = Counter(
        word for text in data.load_documents("pydoc", "test") for word in re.findall(r"\w+|[^\w\s]", text)
    )
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for word in [*required, *(word for word, _ in frequent.most_common())]:
        if len(vocab) == 256:
            break
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    ).save_pretrained(directory)
    return directory


def reference_accuracy(model_dir, items) -> float:
    """Plain torch: the share of items whose correct word has the highest log-likelihood after the passage."""
    import torch

    from pruning.model.blocks import load_model

    model, tokenizer = load_model(str(model_dir))
    correct = 0
    for item in items:
        scores = []
        for choice in item.choices:
            context_ids = tokenizer(item.context, add_special_tokens=False)["input_ids"]
            whole = tokenizer(f"{item.context} {choice}", add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logprobs = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].float(), -1)
            scores.append(sum(float(logprobs[i - 1, whole[i]]) for i in range(len(context_ids), len(whole))))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == item.label)
    return correct / len(items)


def test_offline_suite_scores_pydoc_perplexity_and_cloze(pydoc_model):
    from transformers import AutoTokenizer

    from pruning.evaluation.suites import EvalSettings, evaluate_model, expand_suites, prepare_data
    from pruning.study.evaluation import _expected_metric_count

    assert expand_suites(["all"], is_demo=False) == ["perplexity", "zero-shot"]  # offline is explicit
    tokenizer = AutoTokenizer.from_pretrained(str(pydoc_model))
    items = pydoc_source.cloze_items("test")[:8]
    choices = {choice for item in items for choice in item.choices}
    ids = {tokenizer(f" {choice}", add_special_tokens=False)["input_ids"][0] for choice in choices}
    assert len(ids) == len(choices) and 0 not in ids  # no <unk> among the choices

    settings = EvalSettings(suites=("offline",), engine="torch", seq_len=64, limit=8, progress=False)
    prepared = prepare_data(["offline"], None)
    results = {
        (r.task, r.metric): r for r in evaluate_model(str(pydoc_model), ["offline"], prepared, settings)
    }
    assert set(results) == {
        ("pydoc", "perplexity"),
        ("pydoc_cloze", "acc"),
        ("pydoc_cloze", "acc_norm"),
        ("gcide", "perplexity"),  # the out-of-domain yardstick (tests/test_gcide.py)
        ("gcide_define", "acc"),
    }
    assert all(result.suite == "offline" for result in results.values())
    assert len(results) == _expected_metric_count(["offline"])  # what a study counts as a complete cell
    assert results[("pydoc_cloze", "acc")].value == pytest.approx(reference_accuracy(pydoc_model, items))
    assert results[("pydoc_cloze", "acc")].settings["documents"] == 8
    perplexity = results[("pydoc", "perplexity")]
    assert perplexity.settings["windows"] == 8 and perplexity.settings["seq_len"] == 64
    assert 1 < perplexity.value < 1000


def test_prune_runs_on_pydoc_and_pydoc_cloze(pydoc_model, tmp_path, run_cli):
    for objective, spec in (("perplexity", "pydoc"), ("task_margin", "pydoc-cloze")):
        out = tmp_path / spec
        code, stdout, stderr = run_cli(
            "prune",
            "--model",
            pydoc_model,
            "--objective",
            objective,
            "--data",
            spec,
            "--samples",
            "4",
            "--seq-len",
            "128",  # the longest pydoc-cloze item needs 125 tokens: no silent truncation
            "--drop",
            "1",
            "--search",
            "one_shot",
            "--out",
            out,
            "--json",
        )
        assert code == 0, stderr
        report = json.loads(stdout.strip().splitlines()[-1])
        assert len(report["removed_blocks"]) == 1, report


def test_the_evaluator_draws_what_its_sampling_names(pydoc_model):
    """``--sampling stream`` reaches the evaluator's draw: windows of the joined text, as many as asked even
    where too few whole documents are that long (the draw ``documents`` refuses)."""
    from transformers import AutoTokenizer

    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.scoring.build import build_evaluator

    tokenizer = AutoTokenizer.from_pretrained(str(pydoc_model))
    documents = data.load_documents("pydoc", "calibration")
    seq_len = 256
    long_enough = sum(len(tokenizer(text)["input_ids"]) >= seq_len for text in documents)
    samples = long_enough + 4
    with pytest.raises(UserError, match="--sampling stream"):
        data.load_samples("pydoc", tokenizer, samples, seq_len, seed=0)
    config = CalibrationConfig("perplexity", "pydoc", samples=samples, seq_len=seq_len, sampling="stream")
    evaluator = build_evaluator(str(pydoc_model), config, progress=False)
    expected = data.load_samples("pydoc", tokenizer, samples, seq_len, seed=0, sampling="stream")
    drawn = [row.tolist() for batch in evaluator.batches for row in batch.input_ids]
    assert len(drawn) == samples and drawn == [list(ids) for ids in expected.input_ids]
