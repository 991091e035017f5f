"""What a healing run is asked to do: :class:`HealConfig`, every field checked before anything is loaded.

``HealConfig.settings()`` is the part of the run that decides the healed weights (method, data and splits,
steps, seed, hyper-parameters): it keys the run directory that makes Ctrl-C resumable, and it is what
the registry's ``healing`` record holds besides the run's measurements.

Its fields with ``cli`` metadata are ``depthprune heal``'s options (:mod:`ground.core.cli_options`); the
metadata holds what the command line says differently from the docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ground.core.cli_options import UNSET, cli
from ground.core.errors import UserError
from ground.core.options import SEED_HELP
from pruning.calibration.data.items import TEXT
from pruning.calibration.data.sources import HEAL_SOURCES
from pruning.calibration.data.specs import parse_spec

METHODS = ("lora", "distill", "last-blocks", "patch")
"""``lora``: causal-LM loss through LoRA adapters; ``distill``: KL from the dense model's next-token
distribution (through LoRA adapters, or the kept blocks themselves with ``full_finetune``); ``last-blocks``:
causal-LM loss on the LM head and the last ``last_blocks`` blocks only (Reassessing Layer Pruning's partial
fine-tuning); ``patch``: no training, one linear map per removed span estimated on calibration activations
and fused into the weights (ReplaceMe, :mod:`pruning.healing.patch`)."""
TRAINED_METHODS = ("lora", "distill", "last-blocks")
"""The methods that run the training loop (:mod:`pruning.healing.train`)."""
ESTIMATORS = ("lstsq", "cosine")
"""``patch``: ReplaceMe's closed-form least squares (its recommended default) or its cosine objective
optimised with Adam."""
DEFAULT_LAST_BLOCKS = 3
"""``last-blocks``: blocks trained besides the LM head (Reassessing Layer Pruning, arXiv 2411.15558: 3)."""
COSINE_EPOCHS = 10
"""``patch --estimator cosine``: passes of Adam over the calibration tokens (ReplaceMe's ``adam_method``)."""
COSINE_BATCH_TOKENS = 1024
"""``patch --estimator cosine``: tokens per Adam step (ReplaceMe's ``adam_method``)."""
DEFAULT_PATCH_SAMPLES = 128
"""``patch``: calibration windows at most (ReplaceMe's example configs: 128 sequences)."""
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear projection of a Llama/Qwen/Mistral/Gemma block: attention and MLP."""
DEFAULT_DISTILL_TOP_K = 64
"""Teacher logits kept per position: memory stays bounded on a 128k vocabulary."""
DTYPES = ("float32", "bfloat16", "float16")
HELD_OUT_SPLIT = "test"
"""The split the held-out loss is measured on."""


def training_split(spec: str) -> str:
    """The split healing trains on: the source's ``heal`` split when it has one, else ``calibration``."""
    return "heal" if parse_spec(spec).source in HEAL_SOURCES else "calibration"


def lora_targets_option(text: str | None) -> tuple[str, ...] | object:
    """``heal --lora-targets``: the comma-separated module names; absent: ``UNSET`` (the field's default)."""
    if text is None:
        return UNSET
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _positive_int(value: object, option: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{option} must be an integer >= {minimum}, got {value!r}")


def _positive_number(value: object, option: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UserError(f"{option} must be a positive number, got {value!r}")


def _text_spec(spec: str, option: str) -> None:
    parsed = parse_spec(spec)
    if parsed.kind != TEXT:
        raise UserError(
            f"{option} {spec!r} is multiple-choice data; healing trains and measures on text "
            "(e.g. pydoc, demo:text, text:PATH, c4)"
        )


@dataclass
class HealConfig:
    """One ``heal`` run: which variant, on which text, how, and where the result goes."""

    variant: str
    """The pruned variant to heal: registry name, alias or id (not ``dense``)."""
    data: str = field(
        metadata=cli(
            help="Text to train on: pydoc, demo:text, text:PATH, c4, wikitext2, ... (its heal split when it "
            "has one, else calibration; held-out loss on the test split)."
        )
    )
    """Text data spec to train on (its ``heal`` split when it has one, else ``calibration``)."""
    method: str = field(
        default="lora",
        metadata=cli(
            help="lora (causal-LM loss through LoRA adapters), distill (KL from the dense model's next-token "
            "distribution), last-blocks (causal-LM loss on the LM head and the last --last-blocks blocks) or "
            "patch (no training: ReplaceMe's linear map per removed span, fused into the weights)."
        ),
    )
    """One of :data:`METHODS`."""
    steps: int = field(default=200, metadata=cli())
    """Optimizer steps."""
    lr: float = field(
        default=1e-4, metadata=cli("--lr", help="Peak learning rate (warm-up 5%, cosine decay to a tenth).")
    )
    """Peak learning rate (linear warm-up over the first 5 % of the steps, then cosine decay to a tenth)."""
    lora_rank: int = field(default=8, metadata=cli(help="LoRA rank r (at most the hidden size)."))
    """Rank r of the LoRA adapters; at most the model's hidden size."""
    lora_alpha: float = field(
        default=16.0, metadata=cli(help="LoRA alpha (the update is scaled by alpha / r).")
    )
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    lora_targets: tuple[str, ...] = field(
        default=DEFAULT_LORA_TARGETS,
        metadata=cli(
            type=str | None,
            default=None,
            parse=lora_targets_option,
            help="Block modules that get adapters, comma-separated (default: every linear projection).",
        ),
    )
    """Names of the linear modules in the blocks that get adapters."""
    batch_size: int = field(default=8, metadata=cli(help="Token windows per step."))
    """Token windows per optimizer step."""
    seq_len: int = field(default=512, metadata=cli(help="Tokens per window (capped at the model's context)."))
    """Tokens per window (capped at the model's context)."""
    eval_data: str | None = field(
        default=None,
        metadata=cli(
            help="Text whose test split gives the held-out loss (default: --data's own test split)."
        ),
    )
    """Text spec of the held-out loss (its ``test`` split); None: the training spec's own."""
    eval_windows: int = field(default=64, metadata=cli(help="Held-out windows, at most (evenly spread)."))
    """At most this many held-out windows, evenly spread over the held-out text."""
    distill_top_k: int | None = field(
        default=None, metadata=cli(help="distill: teacher logits kept per position (default 64).")
    )
    """``distill``: teacher logits kept per position (default :data:`DEFAULT_DISTILL_TOP_K`)."""
    lm_loss_weight: float | None = field(
        default=None, metadata=cli(help="distill: weight of the causal-LM loss added to the KL (default 0).")
    )
    """``distill``: weight of the causal-LM loss added to the KL (default 0)."""
    full_finetune: bool = field(
        default=False,
        metadata=cli("--full-finetune", help="distill: train the kept blocks themselves, not LoRA adapters."),
    )
    """``distill``: train every weight of the kept blocks instead of LoRA adapters."""
    last_blocks: int | None = field(
        default=None,
        metadata=cli(
            metavar="K",
            help="last-blocks: train the LM head and the last K blocks (default 3, as Reassessing Layer "
            "Pruning).",
        ),
    )
    """``last-blocks``: how many of the last blocks are trained with the LM head (default
    :data:`DEFAULT_LAST_BLOCKS`)."""
    estimator: str | None = field(
        default=None,
        metadata=cli(
            help="patch: lstsq (ReplaceMe's closed-form least squares, the default) or cosine (ReplaceMe's "
            "cosine objective, Adam from the identity for 10 epochs at --lr)."
        ),
    )
    """``patch``: one of :data:`ESTIMATORS` (default ``lstsq``)."""
    ridge: float | None = field(
        default=None,
        metadata=cli(
            metavar="ALPHA",
            help="patch, lstsq: ridge term added to the normal equations (ReplaceMe's alpha; default 0).",
        ),
    )
    """``patch`` with ``lstsq``: ridge term added to the normal equations' diagonal (ReplaceMe's ``alpha``,
    default 0)."""
    patch_samples: int | None = field(
        default=None,
        metadata=cli(
            metavar="N",
            help="patch: calibration windows of --seq-len tokens, at most (a seeded draw; default 128, as "
            "ReplaceMe's example configs).",
        ),
    )
    """``patch``: calibration windows at most (default :data:`DEFAULT_PATCH_SAMPLES`), a seeded draw."""
    save_every: int = field(
        default=50, metadata=cli(help="Save the training state every N steps (Ctrl-C saves too).")
    )
    """Save the training state every this many steps (and on Ctrl-C, and at the end)."""
    seed: int = field(default=0, metadata=cli(help=SEED_HELP))
    """Seed of the adapters' initialisation and of the data order."""
    device: str = "cpu"
    """torch device of the training (with ``gpus`` above 1: the first card)."""
    gpus: int = 1
    """Cards the student and teacher are spread over (device_map placed by the memory planner)."""
    dtype: str = "float32"
    """dtype the student (and teacher) run in; the checkpoint is saved in the parent's own dtype."""
    registry_url: str | None = None
    """Registry URL; None = the default (``DEPTHPRUNE_REGISTRY_URL`` or SQLite under DEPTHPRUNE_HOME)."""
    out: Path | None = None
    """Parent directory of the healed checkpoint; None = ``DEPTHPRUNE_HOME/variants``."""
    progress: bool = True
    """Show a progress bar with the loss (on stderr)."""
    stop_after: int | None = None
    """Testing hook: behave as if Ctrl-C came right after this many steps (state saved, then interrupted)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        _text_spec(self.data, "--data")
        if self.eval_data is not None:
            _text_spec(self.eval_data, "--eval-data")
        for option, value in (("--steps", self.steps), ("--batch-size", self.batch_size)):
            _positive_int(value, option)
        for option, value in (("--eval-windows", self.eval_windows), ("--save-every", self.save_every)):
            _positive_int(value, option)
        _positive_int(self.seq_len, "--seq-len", minimum=2)
        _positive_int(self.seed, "--seed", minimum=0)
        _positive_number(self.lr, "--lr")
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.stop_after is not None:
            _positive_int(self.stop_after, "stop_after")
        self._check_method_options()
        self._check_new_method_options()

    def _check_new_method_options(self) -> None:
        """The options of ``last-blocks`` and ``patch``: given for another method is a mistake."""
        owners = {
            "--last-blocks": ("last-blocks", self.last_blocks),
            "--estimator": ("patch", self.estimator),
            "--ridge": ("patch", self.ridge),
            "--patch-samples": ("patch", self.patch_samples),
        }
        for option, (owner, value) in owners.items():
            if value is not None and self.method != owner:
                raise UserError(f"{option} applies to --method {owner} only")
        if self.method == "last-blocks":
            self.last_blocks = DEFAULT_LAST_BLOCKS if self.last_blocks is None else self.last_blocks
            _positive_int(self.last_blocks, "--last-blocks")
        if self.method == "patch":
            self.estimator = "lstsq" if self.estimator is None else self.estimator
            if self.estimator not in ESTIMATORS:
                raise UserError(f"--estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")
            self.ridge = 0.0 if self.ridge is None else self.ridge
            if isinstance(self.ridge, bool) or not math.isfinite(self.ridge) or self.ridge < 0:
                raise UserError(f"--ridge must be >= 0, got {self.ridge!r}")
            if self.ridge and self.estimator != "lstsq":
                raise UserError("--ridge applies to --estimator lstsq only")
            self.patch_samples = DEFAULT_PATCH_SAMPLES if self.patch_samples is None else self.patch_samples
            _positive_int(self.patch_samples, "--patch-samples")

    def _check_method_options(self) -> None:
        if self.method != "distill":
            given = [
                option
                for option, value in (
                    ("--distill-top-k", self.distill_top_k),
                    ("--lm-loss-weight", self.lm_loss_weight),
                    ("--full-finetune", self.full_finetune or None),
                )
                if value is not None
            ]
            if given:
                raise UserError(f"{given[0]} applies to --method distill only")
        else:
            self.distill_top_k = DEFAULT_DISTILL_TOP_K if self.distill_top_k is None else self.distill_top_k
            self.lm_loss_weight = 0.0 if self.lm_loss_weight is None else self.lm_loss_weight
            _positive_int(self.distill_top_k, "--distill-top-k")
            if not math.isfinite(self.lm_loss_weight) or self.lm_loss_weight < 0:
                raise UserError(f"--lm-loss-weight must be >= 0, got {self.lm_loss_weight!r}")
        if self.uses_lora:
            _positive_int(self.lora_rank, "--lora-rank")
            _positive_number(self.lora_alpha, "--lora-alpha")
            self.lora_targets = tuple(target.strip() for target in self.lora_targets if target.strip())
            if not self.lora_targets:
                raise UserError("--lora-targets names no module")

    @property
    def uses_lora(self) -> bool:
        """Whether adapters are trained (else the kept blocks themselves, or nothing for ``patch``)."""
        return self.method in ("lora", "distill") and not self.full_finetune

    @property
    def held_out_data(self) -> str:
        """The spec the held-out loss is measured on."""
        return self.eval_data or self.data

    def hyperparameters(self, seq_len: int) -> dict:
        """The training's settings as recorded (``seq_len``: the window length actually used)."""
        return {
            "lr": self.lr,
            "schedule": "linear warm-up 5%, cosine to 0.1",
            "optimizer": "adamw",
            "weight_decay": 0.0,
            "grad_clip": 1.0,
            "batch_size": self.batch_size,
            "seq_len": seq_len,
            "lora_rank": self.lora_rank if self.uses_lora else None,
            "lora_alpha": self.lora_alpha if self.uses_lora else None,
            "lora_targets": list(self.lora_targets) if self.uses_lora else None,
            "lora_dropout": 0.0 if self.uses_lora else None,
            "full_finetune": self.full_finetune,
            "last_blocks": self.last_blocks,
            "distill_top_k": self.distill_top_k,
            "lm_loss_weight": self.lm_loss_weight,
            "eval_windows": self.eval_windows,
            "dtype": self.dtype,
        }

    def patch_settings(self, seq_len: int) -> dict:
        """``patch``: the estimator's settings as recorded (``seq_len``: the window length actually used)."""
        return {
            "estimator": self.estimator,
            "ridge": self.ridge,
            "lr": self.lr if self.estimator == "cosine" else None,
            "epochs": COSINE_EPOCHS if self.estimator == "cosine" else None,
            "batch_tokens": COSINE_BATCH_TOKENS if self.estimator == "cosine" else None,
            "patch_samples": self.patch_samples,
            "seq_len": seq_len,
            "eval_windows": self.eval_windows,
            "dtype": self.dtype,
        }

    def settings(self, seq_len: int) -> dict:
        """What decides the healed weights: the healing record without its measurements."""
        patch = self.method == "patch"
        return {
            "method": self.method,
            "data": self.data,
            "train_split": training_split(self.data),
            "eval_data": self.held_out_data,
            "eval_split": HELD_OUT_SPLIT,
            "steps": 0 if patch else self.steps,
            "seed": self.seed,
            "hyperparameters": self.patch_settings(seq_len) if patch else self.hyperparameters(seq_len),
        }
