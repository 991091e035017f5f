"""The memo journal: a ``prune`` killed with SIGKILL resumes with the scores it had, never with a bound.

Run: ``.venv/bin/python -m pytest tests/test_memo_journal.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from depthprune.testing.data import random_texts, write_jsonl
from ground.core.errors import UserError
from pruning.calibration.scoring.memo import MemoJournal, journalled_memo

KEY = {"model": "m", "dtype": "float32", "config": {"objective": "perplexity", "samples": 4}}

# prune in a subprocess whose every journalled score takes a moment longer, so that the test can kill it
# mid-search.
SLOW_PRUNE = """\
import sys, time
from pruning.calibration.scoring import memo as memo_store
append = memo_store.MemoJournal.append
def slow_append(self, removed, loss):
    append(self, removed, loss)
    time.sleep(0.3)
memo_store.MemoJournal.append = slow_append
from depthprune.cli import main
main(sys.argv[1:])
"""


def journal_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def test_scores_are_read_back_and_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "memo.journal"
    journal = MemoJournal(path, KEY)
    assert journal.replayed == []
    journal.append(frozenset({3, 1}), 2.5)
    journal.append([4], 1.25)
    os.write(os.open(path, os.O_WRONLY | os.O_APPEND), b'{"removed": [2], "lo')  # a kill mid-line
    # (no close: a killed process closes nothing)
    again = MemoJournal(path, KEY)
    assert again.replayed == [([1, 3], 2.5), ([4], 1.25)]
    memo, journal = journalled_memo(path, KEY, {frozenset({5}): 9.0}, num_blocks=6)
    assert memo == {frozenset({5}): 9.0, frozenset({1, 3}): 2.5, frozenset({4}): 1.25}
    memo[frozenset({0})] = 3.0
    memo.update({frozenset({2}): 4.0})
    assert journal_lines(path)[-2:] == [{"removed": [0], "loss": 3.0}, {"removed": [2], "loss": 4.0}]
    journal.close()


def test_a_journal_of_other_calibration_data_is_set_aside_and_an_older_one_is_read(tmp_path, capsys):
    path = tmp_path / "memo.journal"
    journal = MemoJournal(path, KEY, data="a" * 64)
    journal.append([1], 2.0)
    journal.close()
    assert json.loads(path.read_text().splitlines()[0])["data_sha256"] == "a" * 64
    assert MemoJournal(path, KEY, data="a" * 64).replayed == [([1], 2.0)]

    changed = MemoJournal(path, KEY, data="b" * 64)
    assert changed.replayed == []
    assert "was scored on other calibration data" in capsys.readouterr().err
    assert journal_lines(tmp_path / f"memo.other-data-{'a' * 12}.journal") == [{"removed": [1], "loss": 2.0}]
    assert json.loads(path.read_text().splitlines()[0])["data_sha256"] == "b" * 64
    changed.close()

    older = tmp_path / "older.journal"
    MemoJournal(older, KEY).append([2], 3.0)  # written before the fingerprint: no data_sha256
    assert MemoJournal(older, KEY, data="c" * 64).replayed == [([2], 3.0)]
    assert "predates calibration-data fingerprints" in capsys.readouterr().err


def test_compaction_keeps_the_header_and_a_clean_close_deletes(tmp_path):
    path = tmp_path / "memo.journal"
    journal = MemoJournal(path, KEY)
    journal.append([1], 1.0)
    journal.compact()
    journal.append([2], 2.0)  # still appending, to the new file
    assert journal_lines(path) == [{"removed": [2], "loss": 2.0}]
    assert json.loads(path.read_text().splitlines()[0])["format"] == "depthprune-memo-journal/1"
    assert not list(tmp_path.glob("*.tmp"))
    journal.close(delete=True)
    assert not path.exists()


def test_a_journal_of_another_configuration_is_refused(tmp_path):
    path = tmp_path / "memo.journal"
    MemoJournal(path, KEY).close()
    with pytest.raises(UserError, match="another model or calibration configuration"):
        MemoJournal(path, {**KEY, "dtype": "bfloat16"})
    path.write_text("not json\n")
    with pytest.raises(UserError, match="not a journal"):
        MemoJournal(path, KEY)
    impossible = MemoJournal(tmp_path / "other.journal", KEY)
    impossible.append([7], 1.0)  # block 7 of a 6-block model
    impossible.close()
    with pytest.raises(UserError):
        journalled_memo(tmp_path / "other.journal", KEY, {}, num_blocks=6)


@pytest.fixture(scope="module")
def text_data(tmp_path_factory) -> str:
    """A ``text:`` data file in the tiny models' vocabulary: 6 documents to calibrate on, 2 held out."""
    root = tmp_path_factory.mktemp("journal-data")
    return f"text:{write_jsonl(root / 'text.jsonl', random_texts(random.Random(3), rows=8, words=60))}"


def test_only_values_are_journalled_never_bounds(demo_tiny_dir, tmp_path):
    """Greedy under kl on the demo model stops candidates early (bounds): those are never journalled."""
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.scoring.build import build_evaluator
    from pruning.search import SEARCHES

    config = CalibrationConfig("kl", f"demo:text@{demo_tiny_dir}", samples=8, seq_len=32, seed=0)

    def evaluator(**options):
        return build_evaluator(str(demo_tiny_dir), config, progress=False, batch_size=2, **options)

    shortcut = evaluator()
    journal = shortcut.journal_memo(tmp_path / "memo.journal")
    result = SEARCHES["greedy"](shortcut, 3, seed=0, progress=False)
    journal.close()
    stopped = {
        frozenset({*[entry["chosen"] for entry in result.history[: step["step"]]], int(block)})
        for step in result.history
        for block in step.get("stopped", {})
    }
    assert stopped, "kl on the demo model stops some greedy candidates"
    journalled = {
        frozenset(entry["removed"]): entry["loss"] for entry in journal_lines(tmp_path / "memo.journal")
    }
    assert journalled and not stopped & set(journalled)
    assert all(shortcut.lower_bound(removed) is not None for removed in stopped)
    exact = evaluator(shortcuts=False)
    for removed, loss in journalled.items():
        assert loss == exact.score(removed), sorted(removed)

    # Read back by a fresh evaluator: the same values, scored again by nothing.
    fresh = evaluator()
    assert len(fresh.journal_memo(tmp_path / "memo.journal").replayed) == len(journalled)
    before = fresh.stats.block_forwards
    assert [fresh.score(removed) for removed in journalled] == list(journalled.values())
    assert fresh.stats.block_forwards == before


def prune_args(model: str, data: str, out: Path, registry: str) -> list[str]:
    return [
        "prune",
        *("--model", model, "--objective", "perplexity", "--data", data, "--samples", "6", "--seq-len", "32"),
        *("--drop", "3", "--search", "greedy", "--out", str(out), "--registry", registry, "--json"),
    ]


def run_prune(args: list[str], home: Path, slow: bool = False) -> subprocess.Popen:
    """``depthprune ARGS`` in a subprocess with its own DEPTHPRUNE_HOME (``slow``: :data:`SLOW_PRUNE`)."""
    command = [sys.executable, "-c", SLOW_PRUNE] if slow else [sys.executable, "-m", "depthprune.cli"]
    env = {**os.environ, "DEPTHPRUNE_HOME": str(home)}
    return subprocess.Popen(
        [*command, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finished_outcome(process: subprocess.Popen) -> dict:
    out, error = process.communicate(timeout=300)
    assert process.returncode == 0, error
    (line,) = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(line)


@pytest.mark.slow
def test_a_prune_killed_with_sigkill_resumes_with_its_journalled_scores(tiny_model_dirs, text_data, tmp_path):
    model, home = str(tiny_model_dirs("llama")), tmp_path / "home-b"
    registry_a, registry_b = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db"))
    args = prune_args(model, text_data, tmp_path / "b", registry_b)
    uninterrupted = finished_outcome(
        run_prune(prune_args(model, text_data, tmp_path / "a", registry_a), tmp_path / "home-a")
    )

    killed = run_prune(args, home, slow=True)
    deadline = time.monotonic() + 240
    journalled: list[dict] = []
    while len(journalled) < 4:
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()[1]
        time.sleep(0.1)
        journals = list(home.glob("runs/*/memo.journal"))
        journalled = journal_lines(journals[0]) if journals else []
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=30)
    assert killed.returncode == -signal.SIGKILL
    saved = journal_lines(journals[0])
    assert len(saved) >= 4 and not list(home.glob("runs/*/memo.json"))  # only the journal kept them

    resumed = finished_outcome(run_prune(args, home))
    assert resumed["removed_blocks"] == uninterrupted["removed_blocks"]
    assert resumed["calibration_loss"] == uninterrupted["calibration_loss"]
    assert resumed["subset_evaluations"] == uninterrupted["subset_evaluations"]
    assert 0 <= resumed["block_forwards"] < uninterrupted["block_forwards"]
    assert not list(home.glob("runs/*/memo.journal"))  # a clean end folds it into memo.json
    memo = json.loads(next(home.glob("runs/*/memo.json")).read_text())
    values = {tuple(entry["removed"]): entry["loss"] for entry in memo["scores"]}
    assert all(values[tuple(entry["removed"])] == entry["loss"] for entry in saved)
