"""The embedded demo model: corpus, deterministic cached build, HF loading, quality, errors, command line.

Run: ``.venv/bin/python -m pytest tests/test_demo_model.py -q``. Builds use ``DemoRecipe.tiny()``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.data import read_jsonl
from ground.core.checksums import weights_sha256
from ground.core.errors import UserError
from ground.demo import model as demo_model
from ground.demo.corpus import generate_corpus, is_reserved, qa_line
from ground.demo.model import ensure_demo_model, read_quality
from ground.demo.paths import DATA_FILES, default_demo_dir
from ground.demo.recipe import DemoRecipe


def test_corpus_is_deterministic_and_held_out_is_unseen():
    first = generate_corpus(3, 10, 200, 300, 20, 40)
    second = generate_corpus(3, 10, 200, 300, 20, 40)
    assert first == second
    assert generate_corpus(4, 10, 200, 300, 20, 40).train != first.train
    train = set(first.train)
    assert len(first.train) == 500
    assert sum(doc.startswith("Question: ") for doc in first.train) == 300
    assert not train & set(first.text_calibration + first.text_test)
    assert not set(first.text_calibration) & set(first.text_test)
    training_text = "\n".join(first.train)
    for item in first.qa_calibration + first.qa_test:
        assert is_reserved(item["context"], 3)
        assert f"Question: {item['context']}\n" not in training_text
        assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
        assert qa_line(item["context"], item["choices"][item["label"]]).startswith("Question: ")
    contexts = [item["context"] for item in first.qa_calibration + first.qa_test]
    assert len(contexts) == len(set(contexts))


def test_recipe_checks_and_hash():
    assert DemoRecipe().num_layers >= 16 and DemoRecipe().hidden_size >= 256
    assert DemoRecipe().hidden_size // DemoRecipe().num_heads >= 32
    assert DemoRecipe.tiny().hidden_size // DemoRecipe.tiny().num_heads == 32
    assert DemoRecipe().hash() == DemoRecipe().hash() != DemoRecipe.tiny().hash()
    assert dataclasses.replace(DemoRecipe(), seed=1).hash() != DemoRecipe().hash()
    assert default_demo_dir().name == f"demo-{DemoRecipe().hash()}"
    with pytest.raises(ValueError, match="head dimension"):
        DemoRecipe(hidden_size=64, num_heads=4)
    with pytest.raises(ValueError, match="warmup_steps"):
        DemoRecipe(steps=10, warmup_steps=10)
    with pytest.raises(ValueError, match="seq_len"):
        DemoRecipe(seq_len=1024)


def test_directory_layout_and_data_schema(demo_tiny_dir):
    recipe = DemoRecipe.tiny()
    assert demo_tiny_dir == default_demo_dir(recipe)
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "recipe.json",
        "quality.json",
        "README.md",
    ):
        assert (demo_tiny_dir / name).is_file(), name
    meta = json.loads((demo_tiny_dir / "recipe.json").read_text())
    assert meta["recipe_hash"] == recipe.hash() and meta["recipe"] == dataclasses.asdict(recipe)
    data = {name: read_jsonl(demo_tiny_dir / "data" / f"{name}.jsonl") for name in DATA_FILES}
    assert len(data["text_test"]) == len(data["text_calibration"]) == recipe.held_out_text
    assert len(data["qa_test"]) == len(data["qa_calibration"]) == recipe.held_out_qa
    for name in ("train", "text_calibration", "text_test"):
        assert all(set(row) == {"text"} and row["text"] for row in data[name])
    for name in ("qa_calibration", "qa_test"):
        for row in data[name]:
            assert set(row) == {"context", "choices", "label"}
            assert 0 <= row["label"] < len(row["choices"]) and len(row["choices"]) >= 2
    train = [row["text"] for row in data["train"]]
    train_set = set(train)
    training_text = "\n".join(train)
    assert not any(row["text"] in train_set for row in data["text_calibration"] + data["text_test"])
    assert not any(
        f"Question: {row['context']}\n" in training_text for row in data["qa_calibration"] + data["qa_test"]
    )
    # The training corpus teaches the QA format the task margin scores.
    assert any(text.startswith("Question: ") and "\nAnswer: " in text for text in train)


def test_loads_with_transformers(demo_tiny_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(demo_tiny_dir)
    assert config.model_type == "llama" and config.num_hidden_layers == 8 and config.head_dim == 32
    tokenizer = AutoTokenizer.from_pretrained(demo_tiny_dir)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == (
        "<s>",
        "</s>",
        "<pad>",
        "<unk>",
    )
    assert config.vocab_size == len(tokenizer) and config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer("Mara lives in Ashford.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Mara lives in Ashford."
    messages = [{"role": "user", "content": "Where does Mara live?"}]
    chat = tokenizer.apply_chat_template(messages, tokenize=False)
    assert chat == "Question: Where does Mara live?\nAnswer:"
    model = AutoModelForCausalLM.from_pretrained(demo_tiny_dir, dtype=torch.float32).eval()
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    with torch.no_grad():
        generated = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > len(ids)


def test_quality_is_recorded_and_reproducible(demo_tiny_dir):
    """The tiny model beats its unigram baseline, and quality.json matches a fresh measurement."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quality = read_quality(demo_tiny_dir)
    assert quality["perplexity"] < quality["unigram_perplexity"]
    assert quality["qa_chance"] == pytest.approx(0.25)
    assert quality["train_tokens"] == DemoRecipe.tiny().train_tokens and quality["train_seconds"] > 0
    model = AutoModelForCausalLM.from_pretrained(demo_tiny_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo_tiny_dir)
    texts = [row["text"] for row in read_jsonl(demo_tiny_dir / "data" / "text_test.jsonl")]
    train = [row["text"] for row in read_jsonl(demo_tiny_dir / "data" / "train.jsonl")]
    unigram = demo_model.unigram_log_probs(
        demo_model.token_stream(tokenizer, train), len(tokenizer), tokenizer.bos_token_id
    )
    max_length = DemoRecipe.tiny().max_position_embeddings
    measured = demo_model.perplexities(model, tokenizer, texts, unigram, max_length)
    assert measured["perplexity"] == pytest.approx(quality["perplexity"], rel=1e-4)
    assert measured["unigram_perplexity"] == pytest.approx(quality["unigram_perplexity"], rel=1e-6)
    items = read_jsonl(demo_tiny_dir / "data" / "qa_test.jsonl")
    accuracy = demo_model.qa_accuracy(model, tokenizer, items)["qa_accuracy"]
    assert accuracy == pytest.approx(quality["qa_accuracy"])


def test_cache_is_reused_without_training(demo_tiny_dir, monkeypatch):
    stamp = (demo_tiny_dir / "model.safetensors").stat().st_mtime_ns

    def must_not_build(*args, **kwargs):
        raise AssertionError("the cached demo model was rebuilt")

    monkeypatch.setattr(demo_model, "build_demo_model", must_not_build)
    assert ensure_demo_model(DemoRecipe.tiny(), progress=False) == demo_tiny_dir
    assert ensure_demo_model(DemoRecipe.tiny(), out=demo_tiny_dir, progress=False) == demo_tiny_dir
    assert (demo_tiny_dir / "model.safetensors").stat().st_mtime_ns == stamp


def test_rebuild_is_deterministic_and_guards_its_directory(demo_tiny_dir, tmp_path):
    again = ensure_demo_model(DemoRecipe.tiny(), out=tmp_path / "again", progress=False)
    assert weights_sha256(again) == weights_sha256(demo_tiny_dir)
    for name in DATA_FILES:
        relative = Path("data") / f"{name}.jsonl"
        assert (again / relative).read_bytes() == (demo_tiny_dir / relative).read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (demo_tiny_dir / "tokenizer.json").read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir() if not path.name.endswith(".lock")) == ["again"]
    other = dataclasses.replace(DemoRecipe.tiny(), seed=1)
    with pytest.raises(UserError, match="another recipe; pass --force"):
        ensure_demo_model(other, out=again, progress=False)
    assert weights_sha256(again) == weights_sha256(demo_tiny_dir)


def test_refuses_a_directory_that_is_not_a_demo_model(tmp_path):
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    for force in (False, True):
        with pytest.raises(UserError, match="not a demo model"):
            ensure_demo_model(DemoRecipe.tiny(), out=precious, progress=False, force=force)
    assert (precious / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        ensure_demo_model(DemoRecipe.tiny(), out=tmp_path / "file", progress=False)


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_model, "train_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_demo_model(DemoRecipe.tiny(), out=tmp_path / "demo", progress=False)
    assert [path.name for path in tmp_path.iterdir() if not path.name.endswith(".lock")] == []


def test_cli_prints_path_and_quality(demo_tiny_dir):
    code, out, _ = run_cli("demo-model", "--recipe", "tiny", "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["path"] == str(demo_tiny_dir) and shown["recipe_hash"] == DemoRecipe.tiny().hash()
    assert shown["quality"] == read_quality(demo_tiny_dir)
    code, text, _ = run_cli("demo-model", "--recipe", "tiny")
    assert code == 0
    assert str(demo_tiny_dir) in text and "perplexity" in text and "QA accuracy" in text


def test_cli_errors_and_help():
    code, _, err = run_cli("demo-model", "--recipe", "huge")
    assert code == 2
    assert err.strip() == "error: unknown recipe 'huge'; choose one of: default, tiny"
    code, out, _ = run_cli("demo-model", "--help")
    assert code == 0
    assert "--recipe" in out
