"""The ``offline`` suite's lm-eval multiple-choice tasks: items built in Python, written to a file, a YAML
pointed at it.

lm-eval reads a task's documents through ``datasets`` from files, so each task's items are written once to
``DEPTHPRUNE_HOME/data/<name>-<sha256 prefix>.jsonl`` (``{"context", "choices", "label"}`` per line), named by
their content: a Python whose documentation differs, or another dictionary release, gets its own file, and
lm-eval's dataset cache never serves stale items. The task YAMLs are ``pruning/evaluation/tasks/*.yaml``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pruning.calibration.data.items import ChoiceItem

TASKS_DIR = Path(__file__).parent / "tasks"
GCIDE_DEFINE_TASK_FILE = TASKS_DIR / "gcide_define.yaml"


def items_file(name: str, items: list[ChoiceItem]) -> Path:
    """The items as JSONL under ``DEPTHPRUNE_HOME/data``, written once (atomically) per content."""
    from ground.core.settings import home_dir

    rows = [
        json.dumps({"context": item.context, "choices": list(item.choices), "label": item.label})
        for item in items
    ]
    content = "".join(row + "\n" for row in rows)
    digest = hashlib.sha256(content.encode()).hexdigest()[:16]
    path = home_dir() / "data" / f"{name}-{digest}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(content, encoding="utf-8")
        partial.replace(path)  # atomic: a concurrent eval never reads a half-written file
    return path


def items_task_config(task_file: Path, name: str, items: list[ChoiceItem]) -> dict:
    """The lm-eval task of ``task_file`` with its test split pointed at :func:`items_file`'s file.

    Args:
        task_file: a task YAML of ``pruning/evaluation/tasks``.
        name: the file name's stem (``pydoc-cloze-test``, ``gcide-define``).
        items: the task's items.

    Returns:
        The task config, ready for ``TaskManager.load``.
    """
    import yaml

    config = yaml.safe_load(task_file.read_text())
    config["dataset_kwargs"] = {"data_files": {"test": str(items_file(name, items))}}
    return config


def gcide_define_task_config() -> dict:
    """The ``gcide_define`` task (:mod:`pruning.evaluation.gcide`) over the installed dictionary's items."""
    from pruning.evaluation.gcide import define_items

    return items_task_config(GCIDE_DEFINE_TASK_FILE, "gcide-define", define_items())
