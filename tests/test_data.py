"""Data specs: parsing, local files, Commonsense-170k rows in their real format, sampling, offline errors."""

from __future__ import annotations

import json

import pytest

from depthprune.testing.data import write_jsonl
from ground.core.errors import UserError
from ground.demo.paths import data_file
from pruning.calibration import data
from pruning.calibration.data.commonsense import parse_commonsense_row


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
    assert data.parse_spec("commonsense170k:/x/c.json") == data.DataSpec(
        "commonsense170k:/x/c.json", "commonsense170k", data.MULTIPLE_CHOICE, "/x/c.json"
    )


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


# Rows in the format of LLM-Adapters' ft-training_set/commonsense_170k.json (one sub-task each).
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


def test_commonsense_rows_parse_to_option_texts():
    items = [parse_commonsense_row(row) for row in COMMONSENSE_ROWS]
    assert [item.choices for item in items] == [
        ("True", "False"),
        ("Pour it onto a plate", "Pour it into a jar"),
        ("a", "b", "c", "d"),
        ("Ian", "Dennis"),
    ]
    assert [item.label for item in items] == [0, 1, 3, 1]
    assert items[0].context == "do iran and afghanistan speak the same language?"
    assert [item.scoring for item in items] == ["answer", "answer", "answer", "sentence"]


def test_commonsense_answer_field_fallback_and_input():
    row = dict(COMMONSENSE_ROWS[3], output="", input="extra context")
    item = parse_commonsense_row(row)
    assert item.label == 1 and item.context.endswith("\nextra context")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"instruction": "no label set here"}, "Answer format"),
        ({"output": "the correct answer is option3", "answer": "option3"}, "not one of the labels"),
        ({"output": "no answer", "answer": None}, "no 'the correct answer is"),
        ({"instruction": "Q\n\nAnswer format: option1"}, "fewer than two"),
        ({"instruction": "Q _\n\nOption1: a\n\nAnswer format: option1/option2"}, "no 'Option2:' option"),
        ({"instruction": "Q _\n\nOption1: a Option2: \n\nAnswer format: option1/option2"}, "has no text"),
        ({"instruction": "Q\n\nAnswer format: yes/no", "output": "the correct answer is no"}, "sub-tasks"),
    ],
)
def test_commonsense_bad_rows(change, message):
    with pytest.raises(UserError, match=message):
        parse_commonsense_row(dict(COMMONSENSE_ROWS[3], **change))


@pytest.mark.parametrize("spec_form", ["commonsense170k:{}", "commonsense170k@{}"])
def test_commonsense_local_file(tmp_path, spec_form):
    path = tmp_path / "commonsense_170k.json"
    path.write_text(json.dumps(COMMONSENSE_ROWS))
    spec = spec_form.format(path)
    assert data.parse_spec(spec).source == "commonsense170k"
    items = data.load_choice_items(spec)
    assert len(items) == 4 and items[2].label == 3 and items[1].choices[1] == "Pour it into a jar"
    picked = data.sample_choices(spec, 2, seed=1)
    assert len(picked.items) == 2
    with pytest.raises(UserError, match="does not exist"):
        data.load_choice_items(f"commonsense170k:{tmp_path / 'missing.json'}")


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


def test_stream_windows_are_deterministic(tmp_path, tokenizer):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(" ".join(f"w{4 + (d * 7 + i) % 250}" for i in range(30)) for d in range(10)))
    stream = {"sampling": "stream"}
    first = data.sample_text(f"text:{text}", tokenizer, samples=5, seq_len=16, seed=3, **stream)
    again = data.sample_text(f"text:{text}", tokenizer, samples=5, seq_len=16, seed=3, **stream)
    other = data.sample_text(f"text:{text}", tokenizer, samples=5, seq_len=16, seed=4, **stream)
    assert first.input_ids == again.input_ids and first.input_ids != other.input_ids
    assert all(len(window) == 16 for window in first.input_ids)
    assert first.sampling == "stream"
    # 10 documents of 30 tokens + 9 separators = 309 tokens = 19 windows of 16
    assert len(data.text_windows(data.load_documents(f"text:{text}"), tokenizer, 16)) == 19
    with pytest.raises(UserError, match="only 19 windows"):
        data.sample_text(f"text:{text}", tokenizer, samples=20, seq_len=16, seed=0, **stream)


def words(start: int, count: int) -> str:
    """``count`` distinct tiny-tokenizer words from ``w{start}`` on: one token each."""
    return " ".join(f"w{start + i}" for i in range(count))


# Six documents of known token counts; with seq_len 16, documents 1, 3, 4 and 5 are long enough.
DOCUMENT_LENGTHS = [10, 30, 5, 20, 40, 16]
DOCUMENTS = [words(4 + 40 * number, length) for number, length in enumerate(DOCUMENT_LENGTHS)]


def test_documents_one_per_instance_truncated_and_shorter_ones_counted(tmp_path, tokenizer):
    import random

    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": text} for text in DOCUMENTS])
    drawn = data.sample_text(f"text:{path}", tokenizer, samples=3, seq_len=16, seed=7)
    # By hand: visit the documents in the seed's shuffled order, skip those under 16 tokens, keep three.
    order = list(range(6))
    random.Random(7).shuffle(order)
    kept, skipped = [], 0
    for index in order:
        if DOCUMENT_LENGTHS[index] < 16:
            skipped += 1
        elif len(kept) < 3:
            kept.append(index)
        if len(kept) == 3:
            break
    assert drawn.sampling == "documents" and drawn.documents == kept and drawn.skipped == skipped
    assert drawn.input_ids == [tokenizer(DOCUMENTS[index])["input_ids"][:16] for index in kept]
    assert all(len(ids) == 16 for ids in drawn.input_ids)
    # each instance is the beginning of one document (its first word), never a window across two
    assert [ids[0] for ids in drawn.input_ids] == [4 + 40 * index for index in kept]
    again = data.sample_text(f"text:{path}", tokenizer, samples=3, seq_len=16, seed=7)
    assert again.input_ids == drawn.input_ids
    every = data.sample_text(f"text:{path}", tokenizer, samples=4, seq_len=16, seed=0)
    assert sorted(every.documents) == [1, 3, 4, 5] and every.skipped <= 2
    with pytest.raises(UserError) as error:
        data.sample_text(f"text:{path}", tokenizer, samples=5, seq_len=16, seed=0)
    message = str(error.value)
    assert "only 4 documents of at least 16 tokens (2 of its 6 documents are shorter" in message
    assert "fewer than the 5 samples" in message
    assert "--seq-len" in message and "--sampling stream" in message
    with pytest.raises(UserError, match="unknown sampling 'windows'"):
        data.sample_text(f"text:{path}", tokenizer, samples=1, seq_len=16, seed=0, sampling="windows")


def test_text_files_hold_one_document_per_line_or_record(tmp_path):
    plain = tmp_path / "docs.txt"
    plain.write_text("first document\nsecond one\n\n  \nthird\n")
    assert data.load_documents(f"text:{plain}") == ["first document", "second one", "third"]
    records = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a\n\nb"}, {"text": "c"}])
    assert data.load_documents(f"text:{records}") == ["a\n\nb", "c"]


def test_wikitext_lines_become_articles():
    lines = [
        "",
        " = Valkyria Chronicles III = \n",
        "",
        " Senjō no Valkyria 3 is a game . \n",
        " = = Gameplay = = \n",
        " It is played in turns . \n",
        " = Tower Building = \n",
        " The building stands . \n",
    ]
    articles = data.wikitext_articles(lines)
    assert len(articles) == 2
    assert articles[0].startswith(" = Valkyria Chronicles III = \n") and "= = Gameplay = =" in articles[0]
    assert articles[1] == " = Tower Building = \n The building stands . \n"


def test_demo_specs_read_the_demo_directory(tmp_path, tokenizer):
    demo = tmp_path / "demo-model"
    (demo / "data").mkdir(parents=True)
    write_jsonl(data_file(demo, "text_calibration"), [{"text": " ".join(["w5"] * 40)}] * 5)
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


def test_every_source_is_registered_under_its_name_and_every_spec_form_parses():
    """``SOURCES`` is the one list: keys equal names, and each source's spec forms parse to it."""
    for name, source in data.SOURCES.items():
        assert source.name == name and source.kind in (data.TEXT, data.MULTIPLE_CHOICE)
        for form in source.spec_forms:
            parsed = data.parse_spec(form.replace("PATH", "/some/file.jsonl"))
            assert (parsed.source, parsed.kind) == (name, source.kind)
    assert data.known_specs().split(", ")[:2] == ["c4", "wikitext2"]
    assert set(data.HEAL_SOURCES) == {"pydoc", "pydoc-cloze", "pydoc-phrase", "text", "mc"}
