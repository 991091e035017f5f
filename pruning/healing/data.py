"""Healing data: training windows and held-out windows that never share a document, in a seeded order.

Training text is the data spec's ``heal`` split when the source has one (``pydoc``, ``text:PATH``), else its
``calibration`` split; the held-out loss is measured on the ``test`` split of ``--eval-data`` (default: the
same spec). Documents are compared with whitespace collapsed: a training document that also occurs in the
held-out text is left out of training, and when nothing is left (a local file gives the whole file for
every split) the run is refused, since its held-out loss would measure memorisation.

The batch of step ``s`` is a pure function of the seed and ``s`` (:func:`batch_windows`): a resumed run
sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ground.core.errors import UserError
from pruning.calibration.data.sampling import text_windows
from pruning.calibration.data.specs import load_documents
from pruning.healing.config import HELD_OUT_SPLIT, HealConfig, training_split


@dataclass
class HealingData:
    """Token windows to train on and to measure the held-out loss on."""

    train_windows: list[list[int]]
    """Every non-overlapping ``seq_len`` window of the training text."""
    heldout_windows: list[list[int]]
    """At most ``eval_windows`` windows of the held-out text, evenly spread over it."""
    dropped_overlap: int
    """Training documents left out because the held-out text contains them."""

    def facts(self) -> dict:
        """What the healing record notes about the data."""
        return {
            "train_windows": len(self.train_windows),
            "heldout_windows": len(self.heldout_windows),
            "dropped_overlap": self.dropped_overlap,
        }


def _normalised(document: str) -> str:
    return " ".join(document.split())


def _evenly_spread(windows: list[list[int]], count: int) -> list[list[int]]:
    if len(windows) <= count:
        return windows
    return [windows[index * len(windows) // count] for index in range(count)]


def load_healing_data(config: HealConfig, tokenizer, seq_len: int) -> HealingData:
    """Read, separate and cut the training and held-out text of ``config``.

    Args:
        config: the run (``data``, ``eval_data``, ``eval_windows``).
        tokenizer: the variant's tokenizer.
        seq_len: tokens per window.

    Returns:
        The windows.

    Raises:
        UserError: the training text is all in the held-out text, or either has less than one window.
    """
    split = training_split(config.data)
    training = load_documents(config.data, split)
    held_out = load_documents(config.held_out_data, HELD_OUT_SPLIT)
    seen = {_normalised(document) for document in held_out}
    kept = [document for document in training if _normalised(document) not in seen]
    if not kept:
        raise UserError(
            f"the training text ({config.data}, {split} split) is the same as the held-out text "
            f"({config.held_out_data}, {HELD_OUT_SPLIT} split), so the held-out loss would measure "
            "memorisation; pass --eval-data with other text"
        )
    train_windows = text_windows(kept, tokenizer, seq_len)
    heldout_windows = _evenly_spread(text_windows(held_out, tokenizer, seq_len), config.eval_windows)
    for what, spec, windows in (
        ("training", config.data, train_windows),
        ("held-out", config.held_out_data, heldout_windows),
    ):
        if not windows:
            raise UserError(f"the {what} text of {spec!r} has fewer than {seq_len} tokens: lower --seq-len")
    return HealingData(train_windows, heldout_windows, dropped_overlap=len(training) - len(kept))


def batch_windows(num_windows: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Indices of the windows of step ``step`` (from 0): epoch after epoch, each in a seeded shuffle.

    Args:
        num_windows: training windows available.
        batch_size: windows per step.
        seed: the run's seed.
        step: the step, counted from 0.

    Returns:
        ``batch_size`` window indices; a step that straddles two epochs takes the end of one and the
        start of the next.
    """
    orders: dict[int, list[int]] = {}
    picked = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_windows)
        if epoch not in orders:
            order = list(range(num_windows))
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
            orders[epoch] = order
        picked.append(orders[epoch][offset])
    return picked
