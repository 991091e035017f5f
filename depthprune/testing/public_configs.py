"""Public ``config.json`` files of real models (Llama-3.1-8B/70B, Qwen3-8B, Gemma-3-12B) for planning tests.

The values are those published on the Hugging Face hub; only config.json is shipped, never weights.
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"
PUBLIC_MODELS = {
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b.json",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b.json",
    "Qwen/Qwen3-8B": "qwen3-8b.json",
    "google/gemma-3-12b-it": "gemma-3-12b-it.json",
}
"""Hub id -> file under :data:`CONFIG_DIR`."""


def public_config(name: str) -> dict:
    """The parsed config.json of a hub id in :data:`PUBLIC_MODELS`."""
    return json.loads((CONFIG_DIR / PUBLIC_MODELS[name]).read_text())


def public_config_dir(name: str, parent: Path) -> Path:
    """A model directory under ``parent`` holding only that model's config.json (what --dry-run reads)."""
    directory = parent / PUBLIC_MODELS[name].removesuffix(".json")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(public_config(name)))
    return directory
