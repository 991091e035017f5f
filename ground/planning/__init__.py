"""Memory planning from config.json alone: what each step of a command needs, against the devices.

Nothing here imports torch: the gateway sizes its vLLM engines with it. Run ``depthprune prune ... --dry-run``
(or study/heal/eval/serve) to see a plan; :mod:`~ground.planning.commands` builds them.
"""

from ground.planning.commands import (
    CalibrationSizes,
    HealSizes,
    plan_eval,
    plan_heal,
    plan_prune,
    plan_serve,
    plan_study,
    shape_for,
)
from ground.planning.devices import Devices, plan_devices, resolve_device, resolve_dtype
from ground.planning.parameters import count_parameters
from ground.planning.plan import MemoryPlan
from ground.planning.report import EXIT_DOES_NOT_FIT, EXIT_FITS, dry_run, print_plan, refuse_unless_fits
from ground.planning.shape import ModelShape, model_shape, read_model_config

__all__ = [
    "EXIT_DOES_NOT_FIT",
    "EXIT_FITS",
    "CalibrationSizes",
    "Devices",
    "HealSizes",
    "MemoryPlan",
    "ModelShape",
    "count_parameters",
    "dry_run",
    "model_shape",
    "plan_devices",
    "plan_eval",
    "plan_heal",
    "plan_prune",
    "plan_serve",
    "plan_study",
    "print_plan",
    "read_model_config",
    "refuse_unless_fits",
    "resolve_device",
    "resolve_dtype",
    "shape_for",
]
