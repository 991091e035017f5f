"""Flowing text from the Hugging Face hub (through ``datasets``): ``c4``, ``wikitext2``, ``lambada``.

As the pruning literature uses them: C4 ``allenai/c4`` English shards (calibration from the first train
shard, evaluation from ``en/c4-validation.00000-of-00008.json.gz`` like SparseGPT/SLEB), WikiText-2
``wikitext-2-raw-v1`` (train / test), LAMBADA (``cimec/lambada`` validation for calibration,
``EleutherAI/lambada_openai`` test for evaluation, the split lm-eval scores).

A hub row is one document, but WikiText-2's rows are lines, so its calibration split is cut into articles (a
new one at each ``" = Title = "`` heading) and its test split is every line joined with ``"\\n\\n"``, one
document, as SLEB and SparseGPT evaluate it. Offline, a source that cannot be fetched raises a
:class:`UserError` naming the local spec to use instead.
"""

from __future__ import annotations

import re

from ground.core.errors import UserError
from pruning.calibration.data.items import TEXT, DataSpec, Source

C4_FILES = {
    "calibration": ("train", "en/c4-train.00000-of-01024.json.gz"),
    "test": ("validation", "en/c4-validation.00000-of-00008.json.gz"),
}
LOCAL_TEXT = "demo:text or text:PATH; or pydoc (Python's documentation, ships with Python)"
"""What to use instead of a hub text source offline."""


def offline_error(spec: DataSpec, description: str, error: Exception, alternative: str) -> UserError:
    """The one-line error for a hub source that cannot be loaded, naming a local spec to use instead."""
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return UserError(
        f"cannot load {spec.source!r} ({description}): {first_line[:200]}. "
        f"Offline? Use a local spec instead: {alternative}"
    )


def hub_rows(spec: DataSpec, description: str, alternative: str, *args, **kwargs):
    """``datasets.load_dataset(*args, **kwargs)``; any failure becomes a one-line UserError."""
    try:
        from datasets import load_dataset

        return load_dataset(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - network, auth and format errors all mean "not available here"
        raise offline_error(spec, description, error, alternative) from None


def _c4(spec: DataSpec, split: str) -> list[str]:
    hub_split, data_file = C4_FILES[split]
    rows = hub_rows(
        spec, C4.description, LOCAL_TEXT, "allenai/c4", data_files={hub_split: data_file}, split=hub_split
    )
    return [row["text"] for row in rows]


def _wikitext2(spec: DataSpec, split: str) -> list[str]:
    hub_split = "train" if split == "calibration" else "test"
    rows = hub_rows(spec, WIKITEXT2.description, LOCAL_TEXT, "wikitext", "wikitext-2-raw-v1", split=hub_split)
    lines = [row["text"] for row in rows]
    # SLEB/SparseGPT evaluate on every line joined with blank lines; calibration draws whole articles.
    return ["\n\n".join(lines)] if split == "test" else wikitext_articles(lines)


def _lambada(spec: DataSpec, split: str) -> list[str]:
    if split == "calibration":
        rows = hub_rows(spec, LAMBADA.description, LOCAL_TEXT, "cimec/lambada", split="validation")
    else:
        rows = hub_rows(
            spec, LAMBADA.description, LOCAL_TEXT, "EleutherAI/lambada_openai", "default", split="test"
        )
    return [row["text"] for row in rows]


def wikitext_articles(lines: list[str]) -> list[str]:
    """WikiText rows (lines) grouped into articles: a new one starts at each top-level ``" = Title = "``."""
    articles: list[list[str]] = []
    for line in lines:
        if _WIKITEXT_TITLE.match(line) or not articles:
            articles.append([])
        articles[-1].append(line)
    return ["".join(article) for article in articles if "".join(article).strip()]


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = \n?$")

C4 = Source("c4", TEXT, "C4 English (allenai/c4 shards)", _c4)
WIKITEXT2 = Source("wikitext2", TEXT, "WikiText-2 raw (wikitext-2-raw-v1)", _wikitext2)
LAMBADA = Source("lambada", TEXT, "LAMBADA passages", _lambada)
