"""The HTTP boundary: OpenAI request/response shapes the gateway checks, and its own admin shapes.

Requests are checked here only as far as the gateway must understand them (model, stream, user,
max_tokens, the types of the common sampling fields); every other field is kept and forwarded to
vLLM unchanged (``extra="allow"``), so new OpenAI/vLLM parameters pass through without a release.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ground.core.errors import UserError
from registry.experiments import MAX_ARMS, check_spec_name
from server.sequential import QUALITY_MARGIN


class OpenAIRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    @field_validator("stream_options")
    @classmethod
    def _options_need_a_stream(cls, options: dict[str, Any] | None, info: ValidationInfo):
        # vLLM refuses it too, but a refusal after the stream began would be a 200 carrying an error.
        if options and info.data.get("stream") is not True:
            raise ValueError("stream_options is only allowed with stream=true")
        return options

    def requested_output_tokens(self) -> int | None:
        """The largest number of tokens the request may generate, when it says."""
        return self.max_tokens


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: StrictBool | None = None
    logprobs: int | None = Field(default=None, ge=0)
    best_of: int | None = Field(default=None, ge=1, le=128)

    @field_validator("best_of")
    @classmethod
    def _best_of_is_not_streamed(cls, best_of: int | None, info: ValidationInfo):
        # OpenAI's rules: the best of several candidates cannot be streamed, and there are at least n.
        if best_of is not None and best_of > 1 and info.data.get("stream") is True:
            raise ValueError("best_of cannot be used with stream=true")
        n = info.data.get("n")
        if best_of is not None and n is not None and best_of < n:
            raise ValueError(f"best_of ({best_of}) must be at least n ({n})")
        return best_of


class ChatMessage(BaseModel):
    """One message of a chat; content may be text or a list of content parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: StrictBool | None = None

    def requested_output_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class ErrorBody(BaseModel):
    """The inside of an OpenAI error response."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """``{"error": {"message", "type", "param", "code"}}``, the OpenAI error shape."""

    error: ErrorBody


MAX_SHOWN = 40
"""Characters of a refused name quoted back in a message."""
MAX_WEIGHT = 1e6
"""Largest arm weight: weights are relative, and a bound keeps their sum finite and their shares exact."""


def _checked_name(value: str | None, what: str) -> str | None:
    """A name of a spec, or a ValueError (pydantic reports it with the field) for one that cannot be."""
    if value is None:
        return None
    try:
        return check_spec_name(value, what)
    except UserError as error:
        raise ValueError(str(error)) from None


class ArmSpec(BaseModel):
    """One arm of an A/B experiment: a variant picked by name or by calibration objective.

    Every name (``name``, ``variant``, ``objective``, ``fallback``) is 1-128 of ``registry.experiments``'
    ``NAME_CHARACTERS``, so that it goes into a response header and a metric label as it is.
    """

    model_config = ConfigDict(extra="forbid")

    name: StrictStr | None = Field(default=None, description="Arm name (default: the variant or objective).")
    variant: StrictStr | None = Field(default=None, description="A served variant name or registry alias.")
    objective: StrictStr | None = Field(
        default=None, description="Calibration objective, e.g. ppl or margin."
    )
    weight: StrictFloat = Field(
        default=1.0,
        ge=0,
        le=MAX_WEIGHT,
        allow_inf_nan=False,
        description="Relative share of traffic (a number from 0 to 1e6).",
    )
    fallback: StrictStr | None = Field(
        default=None, description="Arm or variant serving this arm's requests while its backend is down."
    )

    @field_validator("name", "variant", "objective", "fallback")
    @classmethod
    def _names(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _checked_name(value, info.field_name)

    @model_validator(mode="after")
    def _one_target(self) -> ArmSpec:
        if (self.variant is None) == (self.objective is None):
            raise ValueError("an arm names exactly one of 'variant' or 'objective'")
        if self.name is None:
            self.name = self.variant or self.objective
        return self


class Guardrails(BaseModel):
    """Limits past which the gateway stops an arm (weight 0) once the arm's confidence sequence lies wholly
    beyond them: the decision stays valid however often it is checked."""

    model_config = ConfigDict(extra="forbid")

    max_nll_delta: StrictFloat | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Most nats per generated token an arm may lose to its control (shadow-scored).",
    )
    max_tpot_ratio: StrictFloat | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Largest time per output token of an arm over its control's.",
    )


class ExperimentSpec(BaseModel):
    """An A/B experiment: requests for ``model=<experiment name>`` are split across its arms.

    The one check of a spec, whoever writes it (admin API, ``depthprune experiments set``, a config file,
    and a gateway reading the registry): at most ``MAX_ARMS`` arms with unique names, strict types.
    """

    model_config = ConfigDict(extra="forbid")

    arms: list[ArmSpec] = Field(min_length=1, max_length=MAX_ARMS)
    sticky: StrictBool = Field(default=True, description="Same user key, same arm (deterministic hashing).")
    fallback: StrictStr | None = Field(
        default=None, description="Default fallback of arms that declare none."
    )
    forcible: list[StrictStr] = Field(
        default_factory=list,
        max_length=MAX_ARMS,
        description="Arms with weight 0 that the x-depthprune-arm header may still force (arms with a "
        "positive weight can always be forced).",
    )
    control: StrictStr | None = Field(
        default=None,
        description="The arm every other arm is compared with (default: the first arm serving the dense "
        "model; an experiment without one must name it).",
    )
    shadow_rate: StrictFloat = Field(
        default=0.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Fraction of every arm's completed completions scored afterwards by the control's model.",
    )
    margin: StrictFloat = Field(
        default=QUALITY_MARGIN,
        ge=0,
        allow_inf_nan=False,
        description="Non-inferiority margin of nll_delta, nats per generated token.",
    )
    guardrails: Guardrails | None = Field(
        default=None, description="Limits past which an arm is stopped (weight 0) by the gateway."
    )

    @field_validator("fallback", "control")
    @classmethod
    def _fallback_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _checked_name(value, info.field_name)

    @model_validator(mode="after")
    def _check_arms(self) -> ExperimentSpec:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        total = sum(arm.weight for arm in self.arms)
        if total <= 0:
            raise ValueError("at least one arm needs a positive weight")
        if not math.isfinite(total):
            raise ValueError("the weights must add up to a finite number")
        unknown = sorted(set(self.forcible) - set(names))
        if unknown:
            shown = ", ".join(repr(name[:MAX_SHOWN]) for name in unknown[:3])
            raise ValueError(f"forcible names no arm: {shown} (arms: {', '.join(names)})")
        if self.control is not None and self.control not in names:
            raise ValueError(f"control {self.control[:MAX_SHOWN]!r} names no arm (arms: {', '.join(names)})")
        return self


class ModelCard(BaseModel):
    """One entry of ``/v1/models``: OpenAI fields plus what depth pruning did to the model."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "depthprune"
    root: str | None = None
    max_model_len: int | None = None
    kind: Literal["variant", "experiment"] = "variant"
    status: str | None = None
    base_model: str | None = None
    removed_blocks: list[int] = Field(default_factory=list)
    num_blocks: int | None = None
    objective: str | None = None
    search: str | None = None
    variant_id: int | None = None
    aliases: list[str] = Field(default_factory=list)
    arms: list[dict[str, Any]] | None = None
    comparison: dict[str, Any] | None = None
    """An experiment's ``control``, ``shadow_rate``, ``margin`` and ``guardrails``; absent for a variant."""
    speculative: dict[str, Any] | None = None
    """A speculative arm's draft, K and dense target (``serve --speculative``); absent otherwise."""


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
