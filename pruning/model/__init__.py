"""The model layer: where weights come from, how blocks are reached, and how a pruned checkpoint is written.

* :mod:`.sources` — a model spec (hub id, directory, GGUF file, embedded name) resolved to a loadable
  directory;
* :mod:`.architectures` — which architectures are supported and where their blocks live;
* :mod:`.blocks` — :func:`~.blocks.load_model` and :class:`~.blocks.BlockStack` (run, skip and cache blocks);
* :mod:`.placement` — a model larger than one card split across cards (``device_map``);
* :mod:`.checkpoint` — a removal mask written as an ordinary Hugging Face checkpoint with ``pruning.json``;
* :mod:`.disk_space` — refusing a write that would not fit, before it starts.

Nothing here knows about objectives, searches or evaluation; every other part of :mod:`pruning` stands on it.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "BlockStack": "pruning.model.blocks",
    "load_model": "pruning.model.blocks",
    "resolve_model": "pruning.model.sources",
    "write_pruned_checkpoint": "pruning.model.checkpoint",
    "PrunedCheckpoint": "pruning.model.checkpoint",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
