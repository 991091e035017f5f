"""Where the demo model and its held-out data live: the one place that spells the layout out.

The demo model directory is ``DEPTHPRUNE_HOME/models/demo-<recipe hash>/`` and carries its data as
``data/<name>.jsonl`` (``DATA_FILES``). Calibration data specs (``demo:text``), the evaluation suites, the
load test's prompts and the benchmarks all find those files through :func:`data_file`; nothing else builds
the path.
Pure Python, so the gateway side can import it without torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from ground.core.errors import UserError
from ground.core.settings import home_dir
from ground.demo.recipe import DemoRecipe

DATA_FILES = ("train", "text_calibration", "text_test", "qa_calibration", "qa_test")
"""The data files of a demo model: training documents, then held-out text and questions per split."""


def default_demo_dir(recipe: DemoRecipe | None = None) -> Path:
    """Where ``ensure_demo_model(recipe)`` keeps the model without ``out`` (the default recipe if None)."""
    recipe = recipe or DemoRecipe()
    return home_dir() / "models" / f"demo-{recipe.hash()}"


def data_file(model_dir: str | Path, name: str) -> Path:
    """The path of data file ``name`` (one of ``DATA_FILES``) of the demo model in ``model_dir``."""
    if name not in DATA_FILES:
        raise ValueError(f"unknown demo data file {name!r}; use one of {', '.join(DATA_FILES)}")
    return Path(model_dir) / "data" / f"{name}.jsonl"


def find_demo_dir(model_path: str | Path) -> Path | None:
    """The demo model directory of a checkpoint: itself when it holds the demo data, else its base model's.

    A pruned variant of the demo model names its base in ``pruning.json``; anything else gives None.
    """
    directory = Path(model_path)
    if data_file(directory, "text_test").is_file():
        return directory
    pruning_file = directory / "pruning.json"
    if pruning_file.is_file():
        base = json.loads(pruning_file.read_text()).get("base_model")
        if base and data_file(base, "text_test").is_file():
            return Path(base)
    return None


def built_data_file(name: str) -> Path:
    """Data file ``name`` of an already built demo model: the default recipe's, else any under the home.

    Never builds (training is ``depthprune demo-model``'s job).

    Raises:
        UserError: no demo model was built yet.
    """
    candidates = [data_file(default_demo_dir(), name)]
    candidates += sorted(data_file(directory, name) for directory in home_dir().glob("models/demo-*"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise UserError(f"the demo model's data/{name}.jsonl was not found; run `depthprune demo-model` first")
