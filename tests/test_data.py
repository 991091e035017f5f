"""Data specs: parsing, local files, Commonsense-170k rows in their real format, sampling, offline errors."""

from __future__ import annotations

import json

import pytest

from depthprune.demo.paths import data_file
from depthprune.errors import UserError
from depthprune.testing.data import write_jsonl
from pruning.calibration import data


@pytest.fixture(scope="module")
def tokenizer():
    from depthprune.testing.models import tiny_tokenizer

    return tiny_tokenizer()


def test_parse_spec_forms():
    assert data.parse_spec("c4") == data.DataSpec("c4", "c4", data.TEXT)
    assert data.parse_spec("demo:qa").kind == data.MULTIPLE_CHOICE
    assert data.parse_spec("demo:text@/m/demo").path == "/m/demo"
    assert data.parse_spec("text:/a/b.txt") == data.DataSpec("text:/a/b.txt", "text", data.TEXT, "/a/b.txt")
    assert data.parse_spec("mc:q.jsonl").kind == data.MULTIPLE_CHOICE
    assert data.parse_spec("commonsense170k@/x/commonsense_170k.json").path == "/x/commonsense_170k.json"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("c5", "unknown data spec"),
        ("", "empty data spec"),
        ("text:", "needs a file path"),
        ("c4@/x", "takes no '@PATH'"),
        ("demo:text@", "empty path"),
        ("text:PATH", None),
    ],
)
def test_parse_spec_errors(spec, message):
    if message is None:  # "text:PATH" is a literal path named PATH: allowed at parse time
        assert data.parse_spec(spec).path == "PATH"
        return
    with pytest.raises(UserError, match=message):
        data.parse_spec(spec)


# Rows in the format of LLM-Adapters' ft-training_set/commonsense_170k.json.
COMMONSENSE_ROWS = [
    {
        "instruction": "Please answer the following question with true or false, question: do iran and "
        "afghanistan speak the same language?\n\nAnswer format: true/false",
        "input": "",
        "output": "the correct answer is true",
        "answer": "true",
    },
    {
        "instruction": "Please choose the correct solution to the question: When boiling butter, "
        "when it's ready, you can\n\nSolution1: Pour it onto a plate\n\n"
        "Solution2: Pour it into a jar\n\n"
        "Answer format: solution1/solution2",
        "input": "",
        "output": "the correct answer is solution2",
        "answer": "solution2",
    },
    {
        "instruction": "Please choose the correct ending to complete the given sentence: "
        "Removing ice from car: Then, the man writes over the snow.\n\n"
        "Ending1: a\nEnding2: b\nEnding3: c\nEnding4: d"
        "\n\n"
        "Answer format: ending1/ending2/ending3/ending4",
        "input": "",
        "output": "the correct answer is ending4.",
        "answer": "ending4",
    },
    {
        "instruction": "Please choose the correct answer to fill in the blank to complete the given "
        "sentence: Ian volunteered to eat Dennis's menudo because _ despised eating intestine.\n\n"
        "Option1: Ian\nOption2: Dennis\n\nAnswer format: option1/option2",
        "input": "",
        "output": "the correct answer is option2",
        "answer": "option2",
    },
]


def test_commonsense_rows_parse():
    items = [data.parse_commonsense_row(row) for row in COMMONSENSE_ROWS]
    assert [item.choices for item in items] == [
        ("true", "false"),
        ("solution1", "solution2"),
        ("ending1", "ending2", "ending3", "ending4"),
        ("option1", "option2"),
    ]
    assert [item.label for item in items] == [0, 1, 3, 1]
    assert items[0].context.startswith("Please answer the following question")


def test_commonsense_answer_field_fallback_and_input():
    row = dict(COMMONSENSE_ROWS[3], output="", input="extra context")
    item = data.parse_commonsense_row(row)
    assert item.label == 1 and item.context.endswith("\nextra context")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"instruction": "no label set here"}, "Answer format"),
        ({"output": "the correct answer is option3", "answer": "option3"}, "not one of the labels"),
        ({"output": "no answer", "answer": None}, "no 'the correct answer is"),
        ({"instruction": "Q\n\nAnswer format: option1"}, "fewer than two"),
    ],
)
def test_commonsense_bad_rows(change, message):
    with pytest.raises(UserError, match=message):
        data.parse_commonsense_row(dict(COMMONSENSE_ROWS[3], **change))


def test_commonsense_local_file(tmp_path):
    path = tmp_path / "commonsense_170k.json"
    path.write_text(json.dumps(COMMONSENSE_ROWS))
    items = data.load_choice_items(f"commonsense170k@{path}")
    assert len(items) == 4 and items[2].label == 3
    picked = data.sample_choices(f"commonsense170k@{path}", 2, seed=1)
    assert len(picked.items) == 2


@pytest.mark.parametrize(
    "row, message",
    [
        ({"context": "q", "choices": ["a", "b"], "label": 2}, "'label' must be an integer index"),
        ({"context": "q", "choices": ["a", "b"], "label": True}, "'label'"),
        ({"context": "q", "choices": ["a", "b"]}, "'label'"),
        ({"context": "q", "choices": ["a"], "label": 0}, "at least two"),
        ({"choices": ["a", "b"], "label": 0}, "'context'"),
    ],
)
def test_bad_choice_rows_name_the_line(tmp_path, row, message):
    path = write_jsonl(tmp_path / "q.jsonl", [{"context": "ok", "choices": ["a", "b"], "label": 0}, row])
    with pytest.raises(UserError, match=f"q.jsonl:2: .*{message}"):
        data.load_choice_items(f"mc:{path}")


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UserError, match="has no items"):
        data.load_choice_items(f"mc:{empty}")
    with pytest.raises(UserError, match="has no text"):
        data.load_documents(f"text:{empty}")
    with pytest.raises(UserError, match="does not exist"):
        data.load_documents(f"text:{tmp_path / 'missing.txt'}")
    with pytest.raises(UserError, match="multiple-choice, not text"):
        data.load_documents("demo:qa@/nowhere")


def test_text_windows_are_deterministic(tmp_path, tokenizer):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(" ".join(f"w{4 + (d * 7 + i) % 250}" for i in range(30)) for d in range(10)))
    first = data.sample_text(f"text:{text}", tokenizer, samples=5, seq_len=16, seed=3)
    again = data.sample_text(f"text:{text}", tokenizer, samples=5, seq_len=16, seed=3)
    other = data.sample_text(f"text:{text}", tokenizer, samples=5, seq_len=16, seed=4)
    assert first.input_ids == again.input_ids and first.input_ids != other.input_ids
    assert all(len(window) == 16 for window in first.input_ids)
    # 10 documents of 30 tokens + 9 separators = 309 tokens = 19 windows of 16
    assert len(data.text_windows(data.load_documents(f"text:{text}"), tokenizer, 16)) == 19
    with pytest.raises(UserError, match="only 19 windows"):
        data.sample_text(f"text:{text}", tokenizer, samples=20, seq_len=16, seed=0)


def test_demo_specs_read_the_demo_directory(tmp_path, tokenizer):
    demo = tmp_path / "demo-model"
    (demo / "data").mkdir(parents=True)
    write_jsonl(data_file(demo, "text_calibration"), [{"text": " ".join(["w5"] * 40)}] * 3)
    write_jsonl(
        data_file(demo, "qa_calibration"),
        [{"context": f"w{i}", "choices": ["w7", "w8"], "label": i % 2} for i in range(6)],
    )
    samples = data.load_samples(f"demo:text@{demo}", tokenizer, samples=4, seq_len=20, seed=0)
    assert isinstance(samples, data.TextSamples) and len(samples.input_ids) == 4
    questions = data.load_samples(f"demo:qa@{demo}", tokenizer, samples=3, seq_len=20, seed=0)
    assert isinstance(questions, data.ChoiceSamples) and len(questions.items) == 3
    with pytest.raises(UserError, match="qa_test.jsonl' does not exist.*demo-model"):
        data.load_choice_items(f"demo:qa@{demo}", split="test")
    with pytest.raises(UserError, match="only 6 items"):
        data.sample_choices(f"demo:qa@{demo}", 7, seed=0)


def test_offline_hub_source_names_local_alternative(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # As on a machine without network: fail at once instead of retrying.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"cannot load 'c4'.*Use a local spec instead: demo:text or text:P"):
        data.load_documents("c4")
    with pytest.raises(UserError, match=r"cannot load 'commonsense170k'.*demo:qa, mc:PATH"):
        data.load_choice_items("commonsense170k")
