"""Quality measured like speed: intervals, pairing against the baseline, the user's own data (issue 38)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.data import random_questions, random_texts, write_jsonl
from ground.core.errors import UserError

# ----------------------------------------------------------------------------------------------- statistics


def test_accuracy_interval_is_the_exact_binomial_one():
    from scipy import stats

    from pruning.evaluation.intervals import accuracy_interval

    interval = accuracy_interval([1] * 31 + [0] * 19)
    exact = stats.binomtest(31, 50).proportion_ci(0.95, method="exact")
    assert interval.point == 0.62 and interval.n == 50
    assert interval.ci95 == pytest.approx([exact.low, exact.high])
    assert accuracy_interval([1] * 10).high == 1.0 and accuracy_interval([1] * 10).low < 1.0


def test_perplexity_interval_resamples_windows_of_the_ratio_estimator():
    import math

    from pruning.evaluation.intervals import perplexity_interval

    rng = random.Random(0)
    tokens = [rng.randint(5, 200) for _ in range(40)]
    nll = [count * rng.uniform(1.0, 3.0) for count in tokens]
    interval = perplexity_interval(nll, tokens)
    assert interval.point == pytest.approx(math.exp(sum(nll) / sum(tokens)))
    assert interval.holds(interval.point) and interval.low < interval.point < interval.high
    assert perplexity_interval(nll, tokens) == interval  # fixed seed: the same interval again
    single = math.exp(nll[0] / tokens[0])
    assert perplexity_interval(nll[:1], tokens[:1]).ci95 == pytest.approx([single, single])


def test_paired_accuracy_difference_and_verdicts():
    from pruning.evaluation.paired import paired_accuracy

    rng = random.Random(1)
    base = [int(rng.random() < 0.7) for _ in range(300)]
    same = paired_accuracy(base, list(base))
    assert same["accuracy_delta"] == 0 and same["accuracy_delta_ci95"] == [0, 0]
    assert same["verdict"] == "no measurable change" and same["retention"] == 100
    worse = [0 if rng.random() < 0.4 else bit for bit in base]
    paired = paired_accuracy(base, worse)
    assert paired["accuracy_delta"] == pytest.approx(sum(worse) / 300 - sum(base) / 300)
    low, high = paired["accuracy_delta_ci95"]
    assert low <= paired["accuracy_delta"] <= high < 0 and paired["verdict"] == "worse"
    assert paired["retention"] == pytest.approx(100 * sum(worse) / sum(base))
    assert paired["items_gained"] == 0 and paired["mcnemar_p"] < 0.05
    assert paired_accuracy(worse, base)["verdict"] == "better"


def test_paired_perplexity_ratio_uses_the_same_windows():
    from pruning.evaluation.paired import paired_perplexity

    rng = random.Random(2)
    tokens = [100] * 30
    base = [rng.uniform(150, 400) for _ in tokens]
    model = [value * 1.1 + rng.uniform(-5, 5) for value in base]  # window to window noise is shared
    paired = paired_perplexity((base, tokens), (model, tokens))
    low, high = paired["perplexity_ratio_ci95"]
    assert low <= paired["perplexity_ratio"] <= high and low > 1 and paired["verdict"] == "worse"
    assert paired["retention"] == pytest.approx(100 / paired["perplexity_ratio"])


def test_pairing_is_by_item_identity_and_refused_when_items_differ():
    from pruning.evaluation.item_scores import accuracy_statistics
    from pruning.evaluation.paired import PairingRefused, compare_statistics

    keys = ["a", "b", "c", "d"]
    base = accuracy_statistics(keys, [1, 1, 0, 0])
    shuffled = accuracy_statistics(["d", "c", "b", "a"], [0, 1, 1, 1])  # a: 1, b: 1, c: 1, d: 0
    assert compare_statistics(base, shuffled)["accuracy_delta"] == pytest.approx(0.25)
    with pytest.raises(PairingRefused, match="items differ"):
        compare_statistics(base, accuracy_statistics(["a", "b", "c", "e"], [1, 1, 0, 0]))
    assert accuracy_statistics(["x", "x"], [1, 0])["items"]["keys"] == ["x", "x#2"]


# ------------------------------------------------------------------------------------------- user data


@pytest.fixture(scope="module")
def dense_dir(tiny_model_dirs):
    return tiny_model_dirs("llama")


@pytest.fixture(scope="module")
def pruned_dir(dense_dir, tmp_path_factory):
    from pruning.model.checkpoint import write_pruned_checkpoint

    out = tmp_path_factory.mktemp("pruned") / "variant"
    write_pruned_checkpoint(str(dense_dir), [1, 2], out)
    return out


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("user-data")
    rng = random.Random(3)
    text = write_jsonl(directory / "notes.jsonl", random_texts(rng, rows=10, words=60))
    questions = random_questions(
        rng, rows=30, choices=3, context_words=6, choice_words=(1, 3), labels="cycle"
    )
    questions[4] = {**questions[4], "context": "the _ sat here", "scoring": "sentence"}
    mc = write_jsonl(directory / "quiz.jsonl", questions)
    return text, mc


def eval_json(*names, suite: str) -> list[dict]:
    code, out, err = run_cli(
        "eval", *names, "--suite", suite, "--engine", "torch", "--seq-len", 32, "--no-record", "--json"
    )
    assert code == 0, err
    return json.loads(out)


def test_eval_user_files_gives_the_paired_schema(dense_dir, pruned_dir, user_files):
    text, mc = user_files
    first = eval_json(dense_dir, pruned_dir, suite=f"text:{text},mc:{mc}")
    baseline, variant = first
    assert baseline["baseline"] and not variant["baseline"]
    assert set(baseline["tasks"]) == {"notes", "quiz"}
    quiz, notes = baseline["tasks"]["quiz"], baseline["tasks"]["notes"]
    assert quiz["n"] == 30 and quiz["metric"] == "acc_norm" and "accuracy_delta" not in quiz
    assert notes["n"] >= 10 and notes["tokens"] > notes["n"]
    for model in first:
        for record in model["tasks"].values():
            key = "accuracy" if "accuracy" in record else "perplexity"
            low, high = record[f"{key}_ci95"]
            assert low <= record[key] <= high
            assert record["interval_method"]
    paired_quiz, paired_notes = variant["tasks"]["quiz"], variant["tasks"]["notes"]
    assert paired_quiz["accuracy_delta"] == pytest.approx(paired_quiz["accuracy"] - quiz["accuracy"])
    low, high = paired_quiz["accuracy_delta_ci95"]
    assert low <= paired_quiz["accuracy_delta"] <= high
    assert paired_quiz["verdict"] in ("no measurable change", "better", "worse")
    ratio = paired_notes["perplexity_ratio"]
    assert ratio == pytest.approx(paired_notes["perplexity"] / notes["perplexity"])
    assert paired_notes["perplexity_ratio_ci95"][0] <= ratio <= paired_notes["perplexity_ratio_ci95"][1]
    assert paired_notes["retention"] == pytest.approx(100 / ratio)
    assert paired_notes["baseline"] == str(dense_dir)
    assert '"keys"' not in json.dumps(first)  # per-item scores go to the registry, not the screen
    assert eval_json(dense_dir, pruned_dir, suite=f"text:{text},mc:{mc}") == first  # fixed seed
    from pruning.evaluation.report import quality_lines

    table = quality_lines(first)
    assert max(len(line) for line in table if line.startswith("  ")) <= 100  # rows; headings name models
    assert (
        f"{quiz['accuracy']:.2f} [{quiz['accuracy_ci95'][0]:.2f}, {quiz['accuracy_ci95'][1]:.2f}]"
        in "\n".join(table)
    )
    assert any(paired_quiz["verdict"] in line for line in table)


def test_user_mc_scores_as_the_lm_eval_demo_task(demo_tiny_dir, tmp_path):
    """``mc:`` answer items are scored exactly as lm-eval scores the demo task (acc and acc_norm)."""
    from pruning.evaluation.suites import EvalSettings, evaluate_model, prepare_data

    qa = demo_tiny_dir / "data" / "qa_test.jsonl"
    suites = ["demo", f"mc:{qa}"]
    settings = EvalSettings(suites=tuple(suites), engine="torch", seq_len=64, progress=False)
    results = evaluate_model(str(demo_tiny_dir), suites, prepare_data(suites, demo_tiny_dir), settings)
    by_key = {(r.task, r.metric): r for r in results}
    for metric in ("acc", "acc_norm"):
        lm_eval, ours = by_key[("demo_qa", metric)], by_key[("qa_test", metric)]
        assert ours.value == pytest.approx(lm_eval.value)
        assert (
            ours.settings["statistics"]["items"]["correct"]
            == lm_eval.settings["statistics"]["items"]["correct"]
        )
        assert lm_eval.settings["statistics"]["n"] == ours.settings["statistics"]["n"]


BAD_ROWS = {
    "missing field": ({"choices": ["a", "b"], "label": 0}, "expected a string field 'context'"),
    "label out of range": ({"context": "q", "choices": ["a", "b"], "label": 2}, "'label' must be"),
    "empty choices": ({"context": "q", "choices": [], "label": 0}, "'choices' must be"),
    "empty choice": ({"context": "q", "choices": ["a", " "], "label": 0}, "'choices' must be"),
    "no blank": ({"context": "q", "choices": ["a", "b"], "label": 0, "scoring": "sentence"}, "blank"),
    "too long": ({"context": " ".join(["w5"] * 400), "choices": ["a", "b"], "label": 0}, "longer than the"),
}


@pytest.mark.parametrize("mistake", sorted(BAD_ROWS))
def test_a_bad_item_is_one_line_naming_file_and_line_before_any_model(
    mistake, dense_dir, tmp_path, monkeypatch
):
    row, message = BAD_ROWS[mistake]
    good = {"context": "w5 w6", "choices": ["w7", "w8"], "label": 1}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, good, row])
    _refuses_before_loading(monkeypatch, dense_dir, f"offline,mc:{path}", f"{path}:3", message)


def test_bad_text_files_are_refused_before_any_model(dense_dir, tmp_path, monkeypatch):
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": "w5 w6"}, {"text": "  "}])
    _refuses_before_loading(monkeypatch, dense_dir, f"text:{empty}", f"{empty}:2", "non-empty string")
    short = tmp_path / "short.txt"
    short.write_text("w5 w6 w7\n")
    _refuses_before_loading(monkeypatch, dense_dir, f"text:{short}", str(short), "shorter than one")
    _refuses_before_loading(
        monkeypatch, dense_dir, f"mc:{tmp_path / 'nope.jsonl'}", "nope.jsonl", "not exist"
    )
    from pruning.evaluation.suites import EvalSettings

    with pytest.raises(UserError, match="needs a file path"):
        EvalSettings(suites=("offline", "mc:"))


def test_a_file_that_is_not_utf8_or_a_directory_is_one_line_before_any_model(
    dense_dir, tmp_path, monkeypatch
):
    """Issue 57, 1 and 6: a UnicodeDecodeError traceback (exit 1) before; a directory 'did not exist'."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"w5 w6 w7\nw5 \xff w6\n")
    _refuses_before_loading(
        monkeypatch, dense_dir, f"text:{latin}", f"{latin}:2", "not UTF-8 text (byte 0xff"
    )
    quiz = tmp_path / "quiz.jsonl"
    quiz.write_bytes(b'{"context": "w5", "choices": ["w6", "w7"], "label": 0}\n{"context": "\xe9"}\n')
    _refuses_before_loading(monkeypatch, dense_dir, f"mc:{quiz}", f"{quiz}:2", "not UTF-8 text")
    surrogate = write_jsonl(
        tmp_path / "surrogate.jsonl", [{"context": "\ud800", "choices": ["a", "b"], "label": 0}]
    )
    _refuses_before_loading(monkeypatch, dense_dir, f"mc:{surrogate}", f"{surrogate}:1", "lone surrogate")
    _refuses_before_loading(monkeypatch, dense_dir, f"text:{tmp_path}", str(tmp_path), "is a directory")
    code, _, err = run_cli("data", "show", f"text:{latin}", "--model", str(dense_dir))
    assert code == 2 and err.count("\n") == 1 and f"{latin}:2: not UTF-8" in err, err


def test_an_item_too_long_for_the_context_is_refused_by_its_bytes_before_tokenising(
    dense_dir, tmp_path, monkeypatch
):
    """Issue 57, 5: a 50 MB line was tokenised whole (169 s, 6.5 GB) only to be called too long."""
    import transformers

    from pruning.evaluation.user_suites import context_length

    limit = context_length(str(dense_dir), "torch") * 64
    good = {"context": "w5 w6", "choices": ["w7", "w8"], "label": 1}
    path = write_jsonl(tmp_path / "huge.jsonl", [good, {**good, "context": "w5 " * (limit // 3 + 1)}])
    tokenizer_class = transformers.PreTrainedTokenizerBase
    original = tokenizer_class.__call__

    def no_long_input(self, text, *args, **kwargs):
        assert len(text) <= limit, "a line over the byte bound was tokenised"
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer_class, "__call__", no_long_input)
    _refuses_before_loading(monkeypatch, dense_dir, f"mc:{path}", f"{path}:2", f"more than the {limit:,}")


def test_a_text_file_is_tokenised_only_as_far_as_the_windows_asked_for(dense_dir):
    """Issue 57, 5: ``--limit 4`` over a 50 MB one-line text tokenised all of it (134 s, 6.4 GB)."""
    from transformers import AutoTokenizer

    from pruning.calibration.data.sampling import text_windows
    from pruning.evaluation.suites import perplexity_windows

    tokenizer = AutoTokenizer.from_pretrained(str(dense_dir))
    rng = random.Random(5)
    document = " ".join(f"w{rng.randrange(5, 60)}" for _ in range(200_000))  # about 0.8 MB, one line
    seen = []
    original = type(tokenizer).__call__

    def counting(self, text, *args, **kwargs):
        seen.append(len(text))
        return original(self, text, *args, **kwargs)

    type(tokenizer).__call__ = counting
    try:
        windows = perplexity_windows([document, "w7 w8"], tokenizer, 16, 4)
    finally:
        type(tokenizer).__call__ = original
    assert len(windows) == 4 and max(seen) < 10_000, seen
    assert windows == text_windows([document[:20_000]], tokenizer, 16)[:4]


def test_an_empty_suite_item_is_refused():
    """Issue 57, 6: ``--suite offline,,mc:x`` ran as ``offline,mc:x``."""
    code, _, err = run_cli("eval", "dense", "--suite", "offline,,mc:x.jsonl", "--no-record")
    assert code == 2 and err.count("\n") == 1 and "--suite 'offline,,mc:x.jsonl' has an empty item" in err


def test_dense_of_a_model_never_registered_is_evaluable_and_registered_on_first_use(
    dense_dir, user_files, tmp_path
):
    """Issue 57, 9: ``eval dense@MODEL`` answered 'base model ... is not registered' until a prune ran."""
    from registry import open_registry

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    text, _ = user_files
    code, out, err = run_cli(
        "eval", f"dense@{dense_dir}", "--suite", f"text:{text}", "--engine", "torch", "--seq-len", 32,
        "--registry", url, "--json",
    )  # fmt: skip
    assert code == 0, err
    (model,) = json.loads(out)
    assert model["results"][0]["metric"] == "perplexity" and model["variant"] is not None
    with open_registry(url) as registry:
        dense = registry.resolve(f"dense@{dense_dir}")
        assert dense.is_dense and registry.evaluations(dense)


def test_a_model_reference_is_the_model_unless_the_registry_knows_it(monkeypatch, dense_dir):
    import pruning.model.sources as sources

    class Registry:
        known = {"ppl-best", "dense@org/known"}

        def resolve(self, name):
            if name not in self.known:
                raise UserError(f"no variant or alias named {name!r}")

    monkeypatch.setattr(
        sources, "resolve_model", lambda model: sources.ResolvedModel(model, f"/cache/{model}")
    )
    registry = Registry()
    assert sources.model_reference("dense@org/new", registry) == "org/new"  # a hub id, never registered
    assert sources.model_reference("org/new", registry) == "org/new"
    assert sources.model_reference("dense@smollm2-135m", registry) == "/cache/smollm2-135m"
    assert sources.model_reference("smollm2-135m", registry) == "/cache/smollm2-135m"
    assert sources.model_reference(f"dense@{dense_dir}", registry) == str(dense_dir)
    for registered in ("ppl-best", "dense@org/known", "dense", "unknown-name"):
        assert sources.model_reference(registered, registry) is None  # the registry's to resolve (or refuse)


def _refuses_before_loading(monkeypatch, model, suite: str, where: str, message: str) -> None:
    import pruning.evaluation.engines as engines
    from pruning.evaluation.suites import EvalSettings, evaluate_variants

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(engines, "open_engine", no_model)
    with pytest.raises(UserError) as refused:
        evaluate_variants(
            [str(model)],
            EvalSettings(suites=tuple(suite.split(",")), engine="torch", seq_len=64),
            record=False,
        )
    text = str(refused.value)
    assert "\n" not in text and where in text and message in text


# -------------------------------------------------------------------------------------------- registry


@pytest.fixture(scope="module")
def other_dense_dir(tmp_path_factory):
    from depthprune.testing.models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("other") / "model", seed=1)


def test_registry_keeps_statistics_and_pairs_separate_runs(dense_dir, other_dense_dir, user_files, tmp_path):
    from pruning.evaluation.paired import recorded_comparison
    from pruning.evaluation.suites import EvalSettings, evaluate_variants
    from registry import open_registry

    text, mc = user_files
    registry = open_registry(f"sqlite:///{tmp_path / 'registry.db'}")
    settings = EvalSettings(suites=(f"text:{text}", f"mc:{mc}"), engine="torch", seq_len=32, progress=False)
    together = evaluate_variants([str(dense_dir), str(other_dense_dir)], settings, registry)
    evaluate_variants([str(dense_dir)], settings, registry)  # a rerun replaces, and keeps the statistics
    stored = registry.evaluations(str(dense_dir))
    assert len(stored) == 3
    quiz = next(info for info in stored if info.metric == "acc_norm")
    assert quiz.settings["statistics"]["n"] == 30
    assert len(quiz.settings["statistics"]["items"]["correct"]) == 30
    paired_in_run = next(r for r in together[1].results if r.metric == "acc_norm").settings["statistics"]
    # the second model alone, in a run of its own: pairing from the registry gives the same numbers
    evaluate_variants([str(other_dense_dir)], settings, registry)
    baseline, other = recorded_comparison(registry, [str(dense_dir), str(other_dense_dir)])
    assert baseline["tasks"]["quiz"]["accuracy_ci95"] == quiz.settings["statistics"]["accuracy_ci95"]
    assert other["tasks"]["quiz"]["accuracy_delta_ci95"] == paired_in_run["paired"]["accuracy_delta_ci95"]
    assert other["tasks"]["quiz"]["verdict"] == paired_in_run["paired"]["verdict"]
    evaluate_variants([str(other_dense_dir)], replace(settings, seq_len=16), registry)  # other windows
    _, other = recorded_comparison(registry, [str(dense_dir), str(other_dense_dir)])
    assert other["tasks"]["notes"]["verdict"].startswith("not paired: items differ")


# ------------------------------------------------------------------------------- prune's held-out data


def test_prune_says_before_loading_that_the_draw_leaves_nothing_to_validate_on(
    dense_dir, tmp_path, monkeypatch
):
    import pruning.model.blocks as blocks

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the validation data was checked")

    monkeypatch.setattr(blocks, "load_model", no_model)
    rng = random.Random(4)
    mc = write_jsonl(tmp_path / "quiz.jsonl", random_questions(rng, rows=24, choices=2))
    text = write_jsonl(tmp_path / "notes.jsonl", random_texts(rng, rows=8, words=30))
    cases = ((f"mc:{mc}", "task_ce", "items", 24), (f"text:{text}", "perplexity", "documents", 8))
    for data, objective, what, samples in cases:
        code, _, err = run_cli(
            "prune", "--model", dense_dir, "--objective", objective, "--data", data, "--drop", 1,
            "--samples", samples, "--seq-len", 16,
        )  # fmt: skip
        assert code == 2, err
        assert f"no {what} left after the calibration draw" in err and "\n" not in err.strip()
