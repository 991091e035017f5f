"""The evaluator's memo on disk: a JSON file of every score, and an append-only journal, so that an
interrupted or killed ``prune`` resumes with its scores.

``prune`` saves the memo (:func:`save_memo`, one JSON file: values, the lower bounds of sets a ranking query
stopped early, and minibatch per-sample losses, with the model and configuration they belong to) after
each search and on Ctrl-C; a ``kill -9``, an out-of-memory kill or a power cut mid-search used to lose every
score of the running search. With a journal attached
(:func:`journal_memo`), every score is also appended, as it is
memoised, to ``memo.journal`` next to ``memo.json``:

* line 1 is a header naming the format, the model, the dtype and the calibration configuration, the key
  that ``memo.json`` carries; a journal with another key is refused;
* every further line is one scored set, ``{"removed": [1, 4], "loss": 2.71}``, written with one ``write``
  call on a file opened for appending, so a killed process loses at most the set it was scoring. ``fsync``
  runs at most once a second (and every 64 lines), so a power cut loses at most that much; a line torn by
  a power cut is skipped when read back, and the journal is rewritten without it before it grows again;
* only values are journalled: the lower bounds of sets a ranking query stopped early stay apart from the
  memo (the score book's ``bounds``) and are never written here, so a resumed run never takes a bound for
  a value;
* compaction: once ``memo.json`` holds every score (written atomically), :meth:`MemoJournal.compact` replaces
  the journal by its header alone (a temporary file renamed over it); a kill between the two replays scores
  that ``memo.json`` already has, which is harmless. On a clean end ``prune`` deletes it.

**The data scored.** A calibration configuration names its data (a dataset, a file) but not its contents,
and those can change under one name: a file edited, a fixed sampling bug, another Python's ``pydoc`` text.
So ``memo.json`` and the journal's header also carry ``data_sha256``, a fingerprint of the calibration tokens
the scores were computed on (:func:`data_sha256`). A memo or journal of other tokens is set aside
(renamed ``*.other-data-<sha>.json``/``.journal``, never deleted) and the run scores afresh, saying so on
stderr; one written before the fingerprint existed is used as it is, saying that too.

Two ``prune`` processes of one configuration share the run directory, its ``memo.json`` and this journal;
lines they append do not mix (each is one ``O_APPEND`` write), but what one compacts away while the other
writes is lost for a crash of the other, as ``memo.json`` is shared the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from ground.core.errors import UserError
from ground.core.files import write_atomically, write_text_atomically
from pruning.calibration.scoring.shortcuts import PartialScore
from pruning.model.blocks import validate_removed

__all__ = [
    "DATA_FIELD",
    "JOURNAL_FORMAT",
    "MEMO_FORMAT",
    "JournalledMemo",
    "MemoJournal",
    "data_sha256",
    "journal_memo",
    "journalled_memo",
    "load_memo",
    "memo_key",
    "save_memo",
]

MEMO_FORMAT = 1

JOURNAL_FORMAT = "depthprune-memo-journal/1"
"""``format`` of a journal's header line."""

DATA_FIELD = "data_sha256"
"""The key of the calibration tokens' fingerprint in ``memo.json`` and the journal's header."""

SYNC_INTERVAL_S = 1.0
"""At most this long between a journalled score and its ``fsync`` (a power cut loses no more)."""

SYNC_EVERY_LINES = 64
"""... and at most this many lines."""


class MemoJournal:
    """An append-only file of scored removal sets under a header (module doc).

    Args:
        path: the journal file; created with its header when missing or empty.
        key: what the scores belong to (model, dtype, calibration configuration), as ``memo.json`` has it.
        data: the fingerprint of the calibration tokens (:func:`data_sha256`); a journal of other tokens is
            set aside (module doc), one without a fingerprint (older) is read as this data's.

    Raises:
        UserError: the file exists with a header of another format or key.
    """

    def __init__(self, path: str | Path, key: dict, data: str | None = None):
        self.path = Path(path)
        self.header = {"format": JOURNAL_FORMAT, **json.loads(json.dumps(key))}
        self.data = data
        self.replayed: list[tuple[list[int], float]] = []
        """The scores a killed run left in the journal, read when it was opened."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file() and self.path.stat().st_size > 0:
            self.replayed = self._read()
        if data is not None:
            self.header[DATA_FIELD] = data
        # Rewritten whole, so that a line torn by a crash is not continued by the next append.
        self._rewrite(self.replayed)
        self._descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._unsynced, self._synced_at = 0, time.monotonic()

    def _read(self) -> list[tuple[list[int], float]]:
        lines = self.path.read_bytes().split(b"\n")
        try:
            header = json.loads(lines[0])
        except ValueError:
            header = None
        recorded = header.pop(DATA_FIELD, None) if isinstance(header, dict) else None
        if header != self.header:
            found = header.get("format") if isinstance(header, dict) else "not a journal"
            raise UserError(
                f"memo journal {str(self.path)!r} belongs to another model or calibration configuration "
                f"({found}); delete it to start afresh"
            )
        if not same_data(self.path, recorded, self.data):
            return []
        scores = []
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                scores.append(([int(block) for block in entry["removed"]], float(entry["loss"])))
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash (only ever the last one) or the empty tail
        return scores

    def _rewrite(self, scores: list[tuple[list[int], float]]) -> None:
        """Replace the file by its header and ``scores``, atomically (a temporary file renamed over it)."""

        def write(partial: Path) -> None:
            with open(partial, "w") as handle:
                handle.write(json.dumps(self.header) + "\n")
                handle.writelines(self._line(removed, loss) for removed, loss in scores)
                handle.flush()
                os.fsync(handle.fileno())

        write_atomically(self.path, write)

    def append(self, removed: Iterable[int], loss: float) -> None:
        """Journal one scored set (a value, never a bound)."""
        # One write call on an O_APPEND descriptor: a kill leaves the line whole or absent.
        os.write(self._descriptor, self._line(removed, loss).encode())
        self._unsynced += 1
        now = time.monotonic()
        if self._unsynced >= SYNC_EVERY_LINES or now - self._synced_at >= SYNC_INTERVAL_S:
            self.sync()

    @staticmethod
    def _line(removed: Iterable[int], loss: float) -> str:
        return json.dumps({"removed": sorted(removed), "loss": float(loss)}) + "\n"

    def sync(self) -> None:
        """``fsync`` what was appended (a power cut loses nothing written before)."""
        if self._unsynced:
            os.fsync(self._descriptor)
        self._unsynced, self._synced_at = 0, time.monotonic()

    def compact(self) -> None:
        """Empty the journal (header kept) once ``memo.json`` holds every score it has."""
        os.close(self._descriptor)
        self._rewrite([])
        self._descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._unsynced = 0

    def close(self, *, delete: bool = False) -> None:
        """Stop journalling; ``delete`` removes the file (``memo.json`` holds every score)."""
        if self._descriptor < 0:
            return
        self.sync()
        os.close(self._descriptor)
        self._descriptor = -1
        if delete:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


class JournalledMemo(dict):
    """The evaluator's memo (``frozenset -> loss``) that appends every score it is given to a journal.

    Every way of adding an entry goes through :meth:`__setitem__`; reading is a plain ``dict``'s.
    """

    def __init__(self, entries: dict, journal: MemoJournal):
        super().__init__(entries)
        self.journal = journal

    def __setitem__(self, removed, loss) -> None:
        super().__setitem__(removed, loss)
        self.journal.append(removed, loss)

    def update(self, *args, **kwargs) -> None:
        for removed, loss in dict(*args, **kwargs).items():
            self[removed] = loss

    def setdefault(self, removed, default=None):
        if removed not in self:
            self[removed] = default
        return self[removed]


def journalled_memo(
    path: str | Path, key: dict, memo: dict, num_blocks: int, data: str | None = None
) -> tuple[JournalledMemo, MemoJournal]:
    """``memo`` with the scores a killed run journalled at ``path`` added, journalling from now on.

    Args:
        path: the journal file.
        key: model, dtype and calibration configuration of the scores (``memo.json``'s).
        memo: the evaluator's memo so far (``memo.json``'s scores included).
        num_blocks: the model's block count (a journalled set is checked against it).
        data: the fingerprint of the calibration tokens (:func:`data_sha256`).

    Returns:
        The memo to use instead, and its journal (``replayed`` lists what was read back).

    Raises:
        UserError: the journal belongs to another model or configuration, or holds an impossible set.
    """
    journal = MemoJournal(path, key, data)
    entries = dict(memo)
    for removed, loss in journal.replayed:
        entries[validate_removed(removed, num_blocks)] = loss
    return JournalledMemo(entries, journal), journal


def data_sha256(evaluator) -> str:
    """Fingerprint of the calibration samples ``evaluator`` scores, independent of how they are batched (a
    smaller GPU plans smaller batches over the same scores): each text window's tokens, or each question's
    choices with their answer positions and tokens and which one is correct, digested one sample at a time
    and combined in sorted order (a mean loss does not depend on the order of its samples). Computed once
    per evaluator (its samples never change), though every save, load and journal records it."""
    known = getattr(evaluator, "_data_sha256", None)
    if known is not None:
        return known
    samples = []
    for batch in evaluator.batches:
        ids, mask = batch.input_ids.cpu(), batch.token_mask.cpu()
        rows = [ids[row][mask[row]].tolist() for row in range(ids.shape[0])]
        if batch.sequence_item is None:
            samples += [_digest(tokens) for tokens in rows]
            continue
        answers = defaultdict(list)
        for row, position, token in zip(
            batch.answer_rows.tolist(), batch.answer_positions.tolist(), batch.answer_tokens.tolist()
        ):
            answers[row].append([position, token])
        correct = set(batch.correct_sequence.tolist())
        choices = defaultdict(list)
        for row, item in enumerate(batch.sequence_item.tolist()):
            choices[item].append(_digest([rows[row], answers[row], row in correct]))
        samples += [_digest(sorted(found)) for found in choices.values()]
    evaluator._data_sha256 = _digest(sorted(samples))
    return evaluator._data_sha256


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()


def same_data(path: Path, recorded: str | None, current: str | None) -> bool:
    """Whether the scores at ``path``, made from tokens fingerprinted ``recorded``, are this run's
    (``current``); a file of other tokens is set aside and False returned, saying so (module doc)."""
    if current is None:
        return True
    if recorded is None:
        print(
            f"{path} predates calibration-data fingerprints: its scores are used as this data's "
            f"(delete it to score afresh)",
            file=sys.stderr,
        )
        return True
    if recorded == current:
        return True
    aside = path.with_name(f"{path.stem}.other-data-{recorded[:12]}{path.suffix}")
    os.replace(path, aside)
    print(
        f"{path} was scored on other calibration data (the data changed under the same configuration): "
        f"set aside as {aside.name}; scoring afresh",
        file=sys.stderr,
    )
    return False


def memo_key(evaluator) -> dict:
    """What a memo belongs to: the model, its dtype and the calibration configuration."""
    return {"model": evaluator.model_id, "dtype": evaluator.dtype, "config": asdict(evaluator.config)}


def save_memo(evaluator, path: str | Path) -> Path:
    """Write every score so far as JSON (atomically), with the model and configuration they belong to."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": MEMO_FORMAT,
        **memo_key(evaluator),
        DATA_FIELD: data_sha256(evaluator),
        "scores": [
            {"removed": sorted(removed), "loss": loss}
            for removed, loss in sorted(evaluator.book.values.items(), key=lambda kv: sorted(kv[0]))
        ],
        # Lower bounds of sets a ranking query stopped early: never values; a resumed ranking reuses them.
        "bounds": [
            {
                "removed": sorted(removed),
                "lower_bound": partial.lower_bound(evaluator.num_samples, evaluator.loss_floor),
            }
            for removed, partial in sorted(evaluator.book.bounds.items(), key=lambda kv: sorted(kv[0]))
        ],
        # Per-sample losses of minibatch scores (score_samples), [[sample, loss], ...]: not values either.
        "sample_losses": [
            {"removed": sorted(removed), "losses": sorted(known.items())}
            for removed, known in sorted(evaluator.book.sample_losses.items(), key=lambda kv: sorted(kv[0]))
        ],
    }
    write_text_atomically(path, json.dumps(payload, indent=1))
    return path


def load_memo(evaluator, path: str | Path) -> int:
    """Add the scores of a :func:`save_memo` file; returns how many were read (its bounds not counted).
    A file of other calibration tokens is set aside and nothing is read (module doc).

    Raises:
        UserError: the file is missing, malformed, or belongs to another model or configuration.
    """
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"memo file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as error:
        raise UserError(f"memo file {str(path)!r} is not valid JSON ({error.msg})") from None
    if not isinstance(payload, dict) or payload.get("format") != MEMO_FORMAT:
        raise UserError(f"{str(path)!r} is not a depthprune score memo")
    expected = memo_key(evaluator)
    for key, value in expected.items():
        if payload.get(key) != value:
            raise UserError(f"memo {str(path)!r} was made for {key} {payload.get(key)!r}, not {value!r}")
    if not same_data(path, payload.get(DATA_FIELD), data_sha256(evaluator)):
        return 0
    for entry in payload["scores"]:
        evaluator.book.values[validate_removed(entry["removed"], evaluator.num_blocks)] = float(entry["loss"])
    for entry in payload.get("bounds", []):
        removed = validate_removed(entry["removed"], evaluator.num_blocks)
        if removed not in evaluator.book.values and removed not in evaluator.book.bounds:
            evaluator.book.bounds[removed] = PartialScore(recorded_bound=float(entry["lower_bound"]))
    for entry in payload.get("sample_losses", []):
        known = evaluator.book.sample_losses.setdefault(
            validate_removed(entry["removed"], evaluator.num_blocks), {}
        )
        known.update((int(sample), float(loss)) for sample, loss in entry["losses"])
    return len(payload["scores"])


def journal_memo(evaluator, path: str | Path) -> MemoJournal:
    """Add the scores a killed run journalled at ``path``, and journal every new score there as it is
    memoised (values only, never bounds; the journal above).

    Returns:
        The :class:`MemoJournal`: compact it after :func:`save_memo`.
    """
    evaluator.book.values, journal = journalled_memo(
        path, memo_key(evaluator), evaluator.book.values, evaluator.num_blocks, data_sha256(evaluator)
    )
    for removed, _ in journal.replayed:
        evaluator.book.bounds.pop(frozenset(removed), None)  # a value read back supersedes a bound
    return journal
