"""The ``prune`` pipeline: calibration data → subset scorer → searches → the held-out choice → checkpoints.

* :mod:`.config` — :class:`~.config.PruneConfig`, one run's settings, checked as they are built;
* :mod:`.prune` — :func:`~.prune.prune`, one run end to end, through the three below;
* :mod:`.plan` — :func:`~.plan.plan_prune`: everything typed checked before any weights load;
* :mod:`.run` — the searches on one shared evaluator or each on a fresh one, and what each cost;
* :mod:`.register` — each outcome scored on held-out data, its checkpoint written, the variant registered;
* :mod:`.heldout` — scoring each search's outcome on the validation split the calibration draw left over;
* :mod:`.heldout_selection` — choosing the variant to keep by that held-out score, never by calibration loss.
"""

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "prune": "pruning.pipeline.prune",
    "PruneConfig": "pruning.pipeline.config",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
