"""The demo's assets: a small model trained here on a generated corpus, and its data.

* :mod:`~depthprune.demo.recipe` — what the demo model is (:class:`DemoRecipe`, ``RECIPES``);
* :mod:`~depthprune.demo.paths` — where it and its held-out data live (the one definition of that layout);
* :mod:`~depthprune.demo.corpus` — the generated world and corpus;
* :mod:`~depthprune.demo.model` — building it (tokenizer, training, quality).

They stand on nothing but the ground (:mod:`depthprune.core`) and torch; the end-to-end ``depthprune demo``
that stands on every package is the shell's (:mod:`depthprune.cli.demo`). Names are resolved on first use.
"""

from depthprune.core.lazy import lazy_exports

_EXPORTS = {
    "DemoRecipe": "depthprune.demo.recipe",
    "RECIPES": "depthprune.demo.recipe",
    "DATA_FILES": "depthprune.demo.paths",
    "data_file": "depthprune.demo.paths",
    "default_demo_dir": "depthprune.demo.paths",
    "find_demo_dir": "depthprune.demo.paths",
    "ensure_demo_model": "depthprune.demo.model",
    "read_quality": "depthprune.demo.model",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
