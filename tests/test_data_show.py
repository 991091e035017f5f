"""``depthprune data show``: the instances exactly as the objective sees them (tiny model's tokenizer)."""

from __future__ import annotations

import json

import pytest

from depthprune.testing.data import write_jsonl


def words(start: int, count: int) -> str:
    return " ".join(f"w{start + i}" for i in range(count))


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return str(tiny_model_dirs("llama"))


def shown(run_cli, *arguments):
    code, out, err = run_cli("data", "show", *arguments)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()], err


def test_text_instances_are_whole_documents_truncated(run_cli, model, tmp_path):
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.data.sampling import sample_text

    lengths = [10, 30, 5, 20]  # documents 1 and 3 reach 16 tokens
    path = write_jsonl(
        tmp_path / "docs.jsonl", [{"text": words(4 + 40 * n, k)} for n, k in enumerate(lengths)]
    )
    instances, summary = shown(
        run_cli, f"text:{path}", "--model", model, "--samples", "2", "--seq-len", "16", "--json"
    )
    assert sorted(instance["document"] for instance in instances) == [1, 3]
    for instance in instances:
        assert instance["tokens"] == 16
        assert instance["text"] == words(4 + 40 * instance["document"], 16)  # the document's first 16 tokens
    assert "2 text instances of 16 tokens" in summary and "documents sampling" in summary
    assert "shorter documents skipped" in summary
    # the draw is the pruning run's: same spec, count, length, seed and sampling
    config = CalibrationConfig("perplexity", f"text:{path}", samples=2, seq_len=16)
    from transformers import AutoTokenizer

    drawn = sample_text(
        config.data, AutoTokenizer.from_pretrained(model), 2, 16, config.seed, sampling=config.sampling
    )
    assert [instance["document"] for instance in instances] == drawn.documents

    streamed, summary = shown(
        run_cli,
        f"text:{path}",
        "--model",
        model,
        "--samples",
        "3",
        "--seq-len",
        "16",
        "--sampling",
        "stream",
        "--json",
    )
    assert len(streamed) == 3 and all(item["document"] is None for item in streamed)
    assert "stream sampling" in summary


def test_too_few_long_documents_say_how_many_were_skipped(run_cli, model, tmp_path):
    path = write_jsonl(tmp_path / "short.jsonl", [{"text": words(4, 5)}, {"text": words(10, 40)}])
    code, out, err = run_cli(
        "data", "show", f"text:{path}", "--model", model, "--samples", "2", "--seq-len", "16"
    )
    assert code == 2 and not out
    assert "only 1 documents of at least 16 tokens (1 of its 2 documents are shorter" in err
    assert "--sampling stream" in err
    code, _, err = run_cli("data", "show", f"text:{path}", "--model", model, "--sampling", "windows")
    assert code == 2 and "unknown --sampling 'windows'" in err


def test_questions_show_the_scored_prompt_and_answer(run_cli, model, tmp_path):
    rows = [
        {"context": "w10 w11", "choices": ["w20", "w21 w22"], "label": 1},
        {"context": "w30 _ w31", "choices": ["w40", "w41"], "label": 0, "scoring": "sentence"},
    ]
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    items, summary = shown(
        run_cli, f"mc:{path}", "--model", model, "--samples", "2", "--seq-len", "32", "--json"
    )
    assert "2 multiple-choice items" in summary
    by_context = {item["context"]: item for item in items}
    answer_item = by_context["w10 w11"]
    assert (answer_item["choices"], answer_item["label"], answer_item["scoring"]) == (
        ["w20", "w21 w22"],
        1,
        "answer",
    )
    # the prompt is "Question: {context}\nAnswer:" (its punctuation is <unk> to the tiny vocabulary)
    assert [scored["answer"] for scored in answer_item["scored"]] == ["w20", "w21 w22"]
    assert all("w10 w11" in scored["prompt"] for scored in answer_item["scored"])
    sentence_item = by_context["w30 _ w31"]
    # the blank filled by each choice; every token after the first is scored
    assert [(s["prompt"], s["answer"]) for s in sentence_item["scored"]] == [
        ("w30", "w40 w31"),
        ("w30", "w41 w31"),
    ]

    code, out, _ = run_cli(
        "data", "show", f"mc:{path}", "--model", model, "--samples", "2", "--seq-len", "32"
    )
    assert code == 0 and "--- item 0" in out and "[*]" in out and "⟦" in out


def test_commonsense_file_shows_option_texts(run_cli, model, tmp_path):
    row = {
        "instruction": "Please choose the correct answer to fill in the blank to complete the given "
        "sentence: The trophy did not fit in the suitcase because the _ was too small.\n\n"
        "Option1: trophy Option2: suitcase Answer format: option1/option2",
        "input": "",
        "output": "the correct answer is option2",
        "answer": "option2",
    }
    path = tmp_path / "commonsense_170k.json"
    path.write_text(json.dumps([row]))
    (item,), _ = shown(run_cli, f"commonsense170k:{path}", "--model", model, "--samples", "1", "--json")
    assert item["context"] == "The trophy did not fit in the suitcase because the _ was too small."
    assert (item["choices"], item["label"], item["scoring"]) == (["trophy", "suitcase"], 1, "sentence")


def test_data_show_explains_itself(run_cli):
    code, out, _ = run_cli("data", "show", "--help")
    assert code == 0
    for option in ("--model", "--samples", "--seq-len", "--data-seed", "--sampling", "--json"):
        assert option in out
