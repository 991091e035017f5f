"""The demo's assets: a small model trained here on a generated corpus, and its data.

* :mod:`~ground.demo.recipe` — what the demo model is (:class:`DemoRecipe`, ``RECIPES``);
* :mod:`~ground.demo.paths` — where it and its held-out data live (the one definition of that layout);
* :mod:`~ground.demo.corpus` — the generated world and corpus;
* :mod:`~ground.demo.model` — building it (tokenizer, training, quality).

They stand on nothing but the ground (:mod:`ground.core`) and torch; the end-to-end ``depthprune demo``
that stands on every package is the shell's (:mod:`depthprune.cli.demo`). Names are resolved on first use.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "DemoRecipe": "ground.demo.recipe",
    "RECIPES": "ground.demo.recipe",
    "DATA_FILES": "ground.demo.paths",
    "data_file": "ground.demo.paths",
    "default_demo_dir": "ground.demo.paths",
    "find_demo_dir": "ground.demo.paths",
    "ensure_demo_model": "ground.demo.model",
    "read_quality": "ground.demo.model",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
