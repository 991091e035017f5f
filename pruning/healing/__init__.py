"""Healing: recover a pruned variant's quality by training it briefly, and register the result as its child.

``depthprune heal VARIANT --data SPEC --method lora|distill`` (:func:`heal`). Modules by job:

* :mod:`~pruning.healing.config` — :class:`HealConfig`, checked before anything loads;
* :mod:`~pruning.healing.data` — training and held-out windows that never share a document, seeded order;
* :mod:`~pruning.healing.losses` — next-token NLL and top-k distillation KL, a chunk of positions at once;
* :mod:`~pruning.healing.state` — the resumable training state under ``DEPTHPRUNE_HOME/runs/heal-<key>/``;
* :mod:`~pruning.healing.train` — LoRA adapters through ``peft`` (or the kept blocks) and the loop;
* :mod:`~pruning.healing.merge` — adapters merged, the ordinary HF checkpoint written atomically;
* :mod:`~pruning.healing.heal` — the pipeline: plan, train, write, register.

Names resolve on first use, so importing this package does not import torch.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "HealConfig": "pruning.healing.config",
    "METHODS": "pruning.healing.config",
    "HealOutcome": "pruning.healing.heal",
    "heal": "pruning.healing.heal",
    "plan_heal": "pruning.healing.heal",
    "merged_model": "pruning.healing.merge",
    "write_healed_checkpoint": "pruning.healing.merge",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
