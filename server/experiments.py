"""Which backend serves a request: a variant by name or alias, or an arm of an A/B experiment.

An experiment splits the requests sent to its name (``model="llama-ab"``) across arms by weight. An arm
names a variant, or a calibration objective that resolves to the best served variant for it (the one
aliased ``<objective>-best``, else the lowest calibration loss). Assignment is sticky: the arm is a
pure function of ``sha256(experiment, user key)``, so a user keeps their arm across requests, gateway
restarts and gateway replicas, and changing weights moves as few users as the cumulative split allows.
The ``x-depthprune-arm`` header forces an arm with a positive weight; a zero-weight (dark) arm only when
the experiment lists it in ``forcible``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from dataclasses import dataclass

from ground.core.objectives import canonical_objective, objective_names
from server.protocol import ExperimentSpec
from server.settings import VariantMetadata


class RoutingError(Exception):
    """The request names no served variant, experiment or arm (the caller answers 4xx)."""

    def __init__(self, message: str, *, param: str, code: str, status: int):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass(frozen=True)
class Arm:
    """One resolved arm: the backend serving it and the backend taking over while it is down."""

    name: str
    backend: str
    weight: float
    fallback: str | None
    objective: str | None


@dataclass(frozen=True)
class Route:
    """The routing decision for one request."""

    backend: str
    experiment: str | None = None
    arm: str | None = None
    fallback: str | None = None


def unit_hash(experiment: str, user_key: str) -> float:
    """A deterministic number in [0, 1) for (experiment, user key); uniform over keys."""
    digest = hashlib.sha256(f"{experiment}\x00{user_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Experiment:
    """A compiled experiment: arms with backends resolved and cumulative weights ready for lookup."""

    def __init__(self, name: str, spec: ExperimentSpec, arms: list[Arm], control: str):
        self.name, self.spec, self.arms = name, spec, arms
        self.control = control
        """The arm every other arm is compared with, and whose engine shadow-scores every arm."""
        self.by_name = {arm.name: arm for arm in arms}
        # A zero-weight arm is dark: forcing it by header is allowed only where the experiment says so.
        self.forcible = {arm.name for arm in arms if arm.weight > 0} | set(spec.forcible)
        total = sum(arm.weight for arm in arms)
        cumulative, running = [], 0.0
        for arm in arms:
            running += arm.weight / total
            cumulative.append(running)
        cumulative[-1] = 1.0  # guard against rounding leaving a sliver above the last arm
        self._cumulative = cumulative

    def choose_arm(self, user_key: str | None, rng: random.Random) -> Arm:
        """The arm for this user key (sticky), or a weighted random arm when there is no key."""
        if user_key is not None and self.spec.sticky:
            point = unit_hash(self.name, user_key)
        else:
            point = rng.random()
        index = bisect.bisect_right(self._cumulative, point)
        # Zero-weight arms have the same cumulative value as their predecessor and are never picked.
        return self.arms[min(index, len(self.arms) - 1)]

    def comparison(self) -> dict:
        """How the arms are compared: the control, the shadow rate, the quality margin, the guardrails."""
        guardrails = self.spec.guardrails.model_dump() if self.spec.guardrails is not None else None
        return {
            "control": self.control,
            "shadow_rate": self.spec.shadow_rate,
            "margin": self.spec.margin,
            "guardrails": guardrails,
        }

    def describe(self) -> list[dict]:
        """Arms as shown by ``/v1/models`` and the admin endpoint."""
        total = sum(arm.weight for arm in self.arms)
        return [
            {
                "name": arm.name,
                "variant": arm.backend,
                "objective": arm.objective,
                "weight": arm.weight,
                "share": arm.weight / total,
                "fallback": arm.fallback,
                "control": arm.name == self.control,
            }
            for arm in self.arms
        ]


class Router:
    """Maps a request's ``model`` (variant, alias or experiment) to a :class:`Route`."""

    def __init__(self, variants: dict[str, VariantMetadata], seed: int | None = None):
        self.variants = variants
        self.aliases: dict[str, str] = {}
        for name, metadata in variants.items():
            for alias in metadata.aliases:
                self.aliases.setdefault(alias, name)
        self.experiments: dict[str, Experiment] = {}
        self.experiments_pending: str | None = None
        """Why the experiments are not known yet (a gateway whose registry has never been read); while set,
        every name that is not a variant answers 503, since it may be an experiment."""
        self._rng = random.Random(seed)

    # -- experiments -------------------------------------------------------------------------
    def set_experiment(self, name: str, spec: ExperimentSpec) -> Experiment:
        """Compile and install (or replace) an experiment, all or nothing.

        The new experiment is compiled and checked completely (its arms resolve, its shares are finite
        numbers) before it replaces anything, so a refused change leaves every experiment as it was.

        Raises:
            ValueError: the name clashes with a variant, or an arm or fallback resolves to nothing served.
        """
        experiment = self.compile_experiment(name, spec)
        shares = [arm["share"] for arm in experiment.describe()]
        if not all(math.isfinite(share) for share in shares):
            raise ValueError(f"the arms' shares are not finite numbers: {shares}")
        self.experiments = {**self.experiments, name: experiment}
        return experiment

    def compile_experiment(self, name: str, spec: ExperimentSpec) -> Experiment:
        """Resolve an experiment's arms and fallbacks to served variants, without installing it.

        Raises:
            ValueError: the name clashes with a variant, or an arm or fallback resolves to nothing served.
        """
        if name in self.variants or name in self.aliases:
            raise ValueError(f"experiment name {name!r} is already a served variant or alias")
        arms = [self._resolve_arm(arm) for arm in spec.arms]
        backend_of_arm = {arm.name: backend for arm, backend in zip(spec.arms, arms)}
        resolved = []
        for arm_spec, backend in zip(spec.arms, arms):
            fallback_name = arm_spec.fallback or spec.fallback
            fallback = None
            if fallback_name is not None:
                fallback = backend_of_arm.get(fallback_name) or self.variant_name(fallback_name)
                if fallback is None:
                    raise ValueError(
                        f"fallback {fallback_name!r} of arm {arm_spec.name!r} is neither an arm "
                        f"nor a served variant"
                    )
                if fallback == backend:
                    fallback = None
            objective = arm_spec.objective or self.variants[backend].objective
            resolved.append(Arm(arm_spec.name, backend, arm_spec.weight, fallback, objective))
        return Experiment(name, spec, resolved, self._control(name, spec, resolved))

    def _control(self, name: str, spec: ExperimentSpec, arms: list[Arm]) -> str:
        """The spec's ``control``, else the first arm that serves the dense model."""
        if spec.control is not None:
            return spec.control
        for arm in arms:  # "dense" is the name serve gives the dense model (and a bare remote has no facts)
            if self.variants[arm.backend].is_dense or arm.backend == "dense":
                return arm.name
        raise ValueError(
            f"experiment {name!r} has no arm serving the dense model: name the arm the others are compared "
            f"with in 'control' (arms: {', '.join(arm.name for arm in arms)})"
        )

    def remove_experiment(self, name: str) -> None:
        """Remove an experiment; KeyError when there is none of that name."""
        remaining = dict(self.experiments)
        del remaining[name]
        self.experiments = remaining

    def _resolve_arm(self, arm) -> str:
        if arm.variant is not None:
            backend = self.variant_name(arm.variant)
            if backend is None:
                raise ValueError(
                    f"arm {arm.name!r}: variant {arm.variant!r} is not served "
                    f"(served: {', '.join(self.variants)})"
                )
            return backend
        return self.best_for_objective(arm.objective)

    def best_for_objective(self, objective: str) -> str:
        """The served variant that stands for a calibration objective.

        Among the served variants calibrated with ``objective`` (``ppl`` and ``margin`` are accepted for
        ``perplexity`` and ``task_margin``), the one named or aliased ``<objective>-best`` wins, else the
        lowest calibration loss.

        Raises:
            ValueError: no served variant was calibrated with that objective.
        """
        wanted = canonical_objective(objective)
        candidates = [
            name
            for name, metadata in self.variants.items()
            if metadata.objective and canonical_objective(metadata.objective) == wanted
        ]
        if not candidates:
            known = sorted({m.objective for m in self.variants.values() if m.objective})
            raise ValueError(
                f"no served variant has calibration objective {objective!r} "
                f"(served objectives: {', '.join(known) or 'none'})"
            )
        best_names = {f"{name}-best" for name in objective_names(wanted)}
        for name in candidates:
            if best_names & {name, *self.variants[name].aliases}:
                return name
        return min(
            candidates,
            key=lambda name: (
                self.variants[name].calibration_loss is None,
                self.variants[name].calibration_loss or 0.0,
                name,
            ),
        )

    def variant_name(self, name: str) -> str | None:
        """The served variant a name or alias refers to, or None."""
        if name in self.variants:
            return name
        return self.aliases.get(name)

    # -- requests ----------------------------------------------------------------------------
    def route(self, model: str, user_key: str | None = None, forced_arm: str | None = None) -> Route:
        """Decide which backend serves a request for ``model``.

        Raises:
            RoutingError: unknown model, or a forced arm the experiment does not have (4xx); 503 for a name
                that is not a variant while the experiments are not known yet.
        """
        if self.experiments_pending is not None and self.variant_name(model) is None:
            raise RoutingError(
                f"'{model}' is not a variant and the experiments are not loaded yet "
                f"({self.experiments_pending}); retry later",
                param="model",
                code="experiments_unavailable",
                status=503,
            )
        experiment = self.experiments.get(model)
        if experiment is None:
            backend = self.variant_name(model)
            if backend is None:
                served = sorted([*self.variants, *self.experiments])
                raise RoutingError(
                    f"The model '{model}' does not exist; served models: {', '.join(served)}",
                    param="model",
                    code="model_not_found",
                    status=404,
                )
            return Route(backend=backend)
        if forced_arm is not None:
            arm = experiment.by_name.get(forced_arm)
            if arm is None:
                raise RoutingError(
                    f"experiment '{model}' has no arm '{forced_arm}'; arms: {', '.join(experiment.by_name)}",
                    param="arm",
                    code="arm_not_found",
                    status=400,
                )
            if arm.name not in experiment.forcible:
                raise RoutingError(
                    f"arm '{forced_arm}' of experiment '{model}' has weight 0 and is not listed as "
                    f"forcible; forcible arms: {', '.join(sorted(experiment.forcible))}",
                    param="arm",
                    code="arm_not_forcible",
                    status=400,
                )
        else:
            arm = experiment.choose_arm(user_key, self._rng)
        return Route(backend=arm.backend, experiment=model, arm=arm.name, fallback=arm.fallback)
