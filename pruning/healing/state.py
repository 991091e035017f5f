"""The resumable state of a healing run, under ``DEPTHPRUNE_HOME/runs/heal-<key>/``.

``state.pt`` holds what the next step depends on: the trainable weights (the LoRA adapters, or the kept
blocks), the optimizer's moments, the step reached, the random generators, and the losses so far. It is
written every ``--save-every`` steps, at the end, and on Ctrl-C, each time to a temporary file renamed into
place, so a crash mid-write leaves the previous state. Ctrl-C is held until the current step ends
(:class:`DeferredInterrupt`): a half-applied optimizer update is never saved. With the batch of every
step a function of the seed and the step, a re-run resumes to exactly the weights of an uninterrupted run.

``done.json`` replaces the state once the healed checkpoint is written and registered: running the same
command again re-registers that checkpoint instead of training again.
"""

from __future__ import annotations

import json
import random
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ground.core.files import write_atomically, write_text_atomically
from ground.core.settings import home_dir

STATE_FILE = "state.pt"
RUN_FILE = "run.json"
DONE_FILE = "done.json"


def run_directory(key: str) -> Path:
    """``DEPTHPRUNE_HOME/runs/heal-<key>`` (not created)."""
    return home_dir() / "runs" / f"heal-{key}"


@dataclass
class TrainingState:
    """Where a run stands, besides its weights and optimizer."""

    step: int = 0
    """Steps done."""
    losses: list[float] = field(default_factory=list)
    """Training loss of each step done."""
    wall_seconds: float = 0.0
    """Training time so far, over every session of the run."""


def save_state(run_dir: Path, model, optimizer, state: TrainingState) -> None:
    """Write the trainable weights, the optimizer, the random generators and ``state`` to ``state.pt``."""
    payload = {
        "trainable": {name: tensor.detach().cpu() for name, tensor in _trainable(model).items()},
        "optimizer": optimizer.state_dict(),
        "step": state.step,
        "losses": list(state.losses),
        "wall_seconds": state.wall_seconds,
        "rng": {
            "python": random.getstate(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
    }
    write_atomically(run_dir / STATE_FILE, lambda path: torch.save(payload, path))


def load_state(run_dir: Path, model, optimizer) -> TrainingState | None:
    """Restore a saved run into ``model`` and ``optimizer``; None when there is none."""
    path = run_dir / STATE_FILE
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=False)
    trainable = _trainable(model)
    with torch.no_grad():
        for name, tensor in payload["trainable"].items():
            trainable[name].copy_(tensor)
    optimizer.load_state_dict(payload["optimizer"])
    random.setstate(payload["rng"]["python"])
    torch.set_rng_state(payload["rng"]["torch"])
    if payload["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["rng"]["cuda"])
    return TrainingState(payload["step"], list(payload["losses"]), payload["wall_seconds"])


def _trainable(model) -> dict[str, torch.Tensor]:
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def write_json(path: Path, value: dict) -> None:
    """``value`` as indented JSON, written atomically."""
    write_text_atomically(path, json.dumps(value, indent=1) + "\n")


class DeferredInterrupt:
    """While active, a first Ctrl-C only sets :attr:`requested` (checked between steps); a second one
    interrupts at once. Outside the main thread, where signals cannot be caught, it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        """Whether Ctrl-C came since entering."""
        self._previous = None
        self._installed = False

    def _handle(self, _signal_number, _frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc_info) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
