"""Speculative arms: dense served under a name of its own with a pruned variant as vLLM's draft model.

``depthprune serve --variants dense --speculative dense-spec=ppl-best:3`` serves the dense model as
``dense-spec`` with ``ppl-best`` drafting 3 tokens per step (vLLM ``--speculative-config
'{"method": "draft_model", "model": DRAFT_DIR, "num_speculative_tokens": 3}'``). Dense verifies every drafted
token, so greedy output equals dense's; the draft only changes speed. ``dense-spec`` is a variant like any
other to the gateway: routable by name, an A/B arm, with its own metrics (vLLM's acceptance counters are
re-exported per served name, :mod:`server.metrics`).

A draft is checked here before any engine starts: it must be pruned from the same base (``pruning.json``'s
``base_model`` and ``base_weights_sha256`` against the dense model's) and share its vocabulary (``vocab_size``
of both config.json files, and the tokenizer files where both have them). K must be at least 1, at most
:data:`MAX_NUM_SPECULATIVE_TOKENS`, and shorter than the context of the draft and of the target (their
``max_position_embeddings``, and ``--max-model-len`` when given): vLLM itself checks only that K is positive,
and engines started with 1,000 drafted tokens beside a 128-token context.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ground.core.errors import UserError
from server.settings import BackendSpec, SpeculativeDraft, metadata_from_variant

__all__ = [
    "DEFAULT_NUM_SPECULATIVE_TOKENS",
    "MAX_NUM_SPECULATIVE_TOKENS",
    "SpeculativeRequest",
    "parse_speculative",
    "speculative_backends",
]

DEFAULT_NUM_SPECULATIVE_TOKENS = 5
"""K when not given. vLLM 0.32 has no default for a draft model (``SpeculativeConfig`` takes one only from a
draft config's ``n_predict``, which MTP heads have and a pruned Llama has not); its documentation's
draft-model example speculates 5 tokens, so that is ours."""
MAX_NUM_SPECULATIVE_TOKENS = 32
"""The most tokens a draft may propose per step. A step keeps the drafted tokens up to the first one the
target rejects: with a per-token acceptance rate ``a`` it yields ``(1 - a^(K+1)) / (1 - a)`` tokens on
average, never more than ``1 / (1 - a)``, while each drafted token costs a forward of the draft. At
``a = 0.9`` (high for a pruned draft) K = 32 already gives 9.7 of those 10 tokens, and every further drafted
token adds under 0.04 while costing as much as the first; a larger K only spends draft compute and KV
cache."""
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A speculative arm's name: ASCII letters, digits, ``.``, ``_`` and ``-`` (what its error says)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
"""Files that define a vocabulary: where both checkpoints have one, they must be byte-identical."""


@dataclass(frozen=True)
class SpeculativeRequest:
    """One ``--speculative NAME=DRAFT[:K]`` item."""

    name: str
    """The served name of the arm (what clients send as ``model``)."""
    draft: str
    """Registry name or alias of the draft variant, or a checkpoint directory."""
    num_speculative_tokens: int
    """K, tokens the draft proposes per step."""


def parse_speculative(text: str | None) -> list[SpeculativeRequest]:
    """``"dense-spec=ppl-best:3,s2=/ckpt/m8"`` -> one :class:`SpeculativeRequest` each.

    Raises:
        UserError: an empty item, an item that is not NAME=DRAFT[:K], a NAME of other characters than
            ASCII letters, digits, ``.``, ``_`` and ``-``, or K outside 1..:data:`MAX_NUM_SPECULATIVE_TOKENS`.
    """
    from ground.core.lists import option_items

    requests = []
    items = option_items(text, "--speculative", "dense-spec=ppl-best:3") if text else []
    for item in items:
        name, sep, rest = item.partition("=")
        draft, colon, count = rest.rpartition(":") if ":" in rest else (rest, "", "")
        name, draft = name.strip(), draft.strip()
        if not (sep and name and draft):
            raise UserError(
                f"--speculative {item!r} must look like NAME=DRAFT[:K] (e.g. dense-spec=ppl-best:3)"
            )
        if not SERVED_NAME.fullmatch(name):
            raise UserError(
                f"--speculative {item!r}: the name {name!r} may hold only ASCII letters, digits, '-', '_' "
                "and '.', starting with a letter or digit"
            )
        k = DEFAULT_NUM_SPECULATIVE_TOKENS
        if colon:
            try:
                k = int(count)
            except ValueError:
                raise UserError(f"--speculative {item!r}: K must be a whole number, got {count!r}") from None
        if not 1 <= k <= MAX_NUM_SPECULATIVE_TOKENS:
            raise UserError(
                f"--speculative {item!r}: K (drafted tokens per step) must be in "
                f"1..{MAX_NUM_SPECULATIVE_TOKENS}, got {k}"
            )
        requests.append(SpeculativeRequest(name, draft, k))
    return requests


def speculative_backends(
    requests: list[SpeculativeRequest],
    backends: list[BackendSpec],
    registry_url: str | None,
    max_model_len: int | None = None,
) -> list[BackendSpec]:
    """One managed backend per request: the dense model with its draft, checked against it.

    The dense model is the one served in ``backends`` (the managed one whose metadata says dense), else the
    registry's ``dense`` of the draft's base.

    Raises:
        UserError: a draft that cannot be found, of another base or vocabulary than the dense model, or a K
            that is not shorter than the draft's or the target's context (``max_model_len`` when given).
    """
    if not requests:
        return []
    from registry import open_registry

    specs = []
    with open_registry(registry_url) as registry:
        for request in requests:
            draft_dir, draft_info = draft_checkpoint(registry, request.draft)
            dense = served_dense(backends)
            target = dense.name if dense is not None else None
            if dense is None:
                dense, target = dense_of(registry, draft_dir, draft_info)
            check_draft(request, draft_dir, dense)
            check_context(request, draft_dir, dense, max_model_len)
            speculative = SpeculativeDraft(
                model_dir=str(draft_dir),
                num_speculative_tokens=request.num_speculative_tokens,
                draft=request.draft,
                draft_variant_id=None if draft_info is None else draft_info.id,
                target=target,
            )
            metadata = dataclasses.replace(dense.metadata, aliases=[], speculative=speculative.card())
            specs.append(
                BackendSpec(
                    name=request.name, model_dir=dense.model_dir, metadata=metadata, speculative=speculative
                )
            )
    return specs


def draft_checkpoint(registry, draft: str):
    """``(directory, registry VariantInfo or None)`` of a draft given by registry name/alias or directory."""
    local = Path(draft).expanduser()
    if local.is_dir():
        return local.resolve(), None
    try:
        info = registry.resolve(draft)
    except UserError as error:
        raise UserError(f"--speculative draft {draft!r}: {error}") from None
    if info.is_dense:
        raise UserError(f"--speculative draft {draft!r} is the dense model itself: give a pruned variant")
    if not info.checkpoint_path or not Path(info.checkpoint_path).expanduser().is_dir():
        raise UserError(f"--speculative draft {draft!r} has no checkpoint directory here")
    registry.verify_checkpoint(info)
    return Path(info.checkpoint_path).expanduser().resolve(), info


def served_dense(backends: list[BackendSpec]) -> BackendSpec | None:
    """The managed dense backend among those served, if exactly one."""
    dense = [
        spec for spec in backends if spec.managed and spec.metadata.is_dense and spec.speculative is None
    ]
    return dense[0] if len(dense) == 1 else None


def dense_of(registry, draft_dir: Path, draft_info) -> tuple[BackendSpec, str]:
    """The registry's dense model of the draft's base, as a backend spec (not served itself), and the name
    that resolves it in the registry.

    Raises:
        UserError: the draft records no base, or its base is not registered.
    """

    pruning = read_json(draft_dir / "pruning.json") or {}
    base = draft_info.base_model if draft_info is not None else pruning.get("base_model")
    if not base:
        raise UserError(f"--speculative draft {str(draft_dir)!r} records no base model (pruning.json)")
    info = registry.resolve(base)
    metadata = metadata_from_variant(info, "dense")
    spec = BackendSpec(name=info.name, model_dir=info.checkpoint_path or base, metadata=metadata)
    return spec, info.qualified_name


def check_draft(request: SpeculativeRequest, draft_dir: Path, dense: BackendSpec) -> None:
    """Refuse a draft of another base or vocabulary than ``dense``, in one line.

    Raises:
        UserError: the reason, naming both sides.
    """
    where = f"--speculative {request.name}={request.draft}"
    pruning = read_json(draft_dir / "pruning.json")
    if pruning is None:
        raise UserError(f"{where}: {draft_dir} is not a depthprune variant (no pruning.json)")
    dense_dir = Path(dense.model_dir).expanduser()
    dense_sha = dense_weights_sha256(dense)
    if dense_sha and pruning.get("base_weights_sha256") and pruning["base_weights_sha256"] != dense_sha:
        raise UserError(
            f"{where}: the draft was pruned from other weights ({pruning.get('base_model')}, sha256 "
            f"{pruning['base_weights_sha256'][:12]}) than {dense.name} (sha256 {dense_sha[:12]})"
        )
    if not dense_sha and not same_model(
        pruning.get("base_model"), dense.model_dir, dense.metadata.base_model
    ):
        raise UserError(
            f"{where}: the draft was pruned from {pruning.get('base_model')}, not from {dense.name} "
            f"({dense.metadata.base_model or dense.model_dir})"
        )
    if dense_dir.is_dir():
        draft_vocab = vocab_size(draft_dir)
        dense_vocab = vocab_size(dense_dir)
        if draft_vocab != dense_vocab:
            raise UserError(
                f"{where}: the draft's vocabulary ({draft_vocab} tokens) is not {dense.name}'s "
                f"({dense_vocab})"
            )
        for name in TOKENIZER_FILES:
            if (draft_dir / name).is_file() and (dense_dir / name).is_file():
                if file_sha256(draft_dir / name) != file_sha256(dense_dir / name):
                    raise UserError(f"{where}: the draft's tokenizer ({name}) differs from {dense.name}'s")


def check_context(
    request: SpeculativeRequest, draft_dir: Path, dense: BackendSpec, max_model_len: int | None
) -> None:
    """Refuse a K that is not shorter than the draft's or the target's context (``max_position_embeddings``
    of each config.json found, and ``max_model_len``): a step drafts K tokens after at least one of the
    prompt's, so no K that large can ever be used.

    Raises:
        UserError: naming K and the context it does not fit.
    """
    contexts = {"--max-model-len": max_model_len}
    for label, directory in (("the draft", draft_dir), (dense.name, Path(dense.model_dir).expanduser())):
        config = read_json(directory / "config.json") if directory.is_dir() else None
        config = config or {}
        contexts[f"{label}'s context"] = config.get("max_position_embeddings") or (
            config.get("text_config") or {}
        ).get("max_position_embeddings")
    known = {label: int(value) for label, value in contexts.items() if isinstance(value, int) and value > 0}
    if not known:
        return
    label, context = min(known.items(), key=lambda pair: pair[1])
    if request.num_speculative_tokens >= context:
        raise UserError(
            f"--speculative {request.name}={request.draft}:{request.num_speculative_tokens}: K must be "
            f"shorter than {label} of {context} tokens"
        )


def dense_weights_sha256(dense: BackendSpec) -> str | None:
    """sha256 of the dense model's weights (what a variant's ``base_weights_sha256`` records), when local."""
    if dense.metadata.is_dense and dense.model_dir:
        from ground.core.checksums import weights_sha256

        directory = Path(dense.model_dir).expanduser()
        if directory.is_dir() and any(directory.glob("*.safetensors")):
            return weights_sha256(directory)
    return None


def same_model(draft_base: str | None, dense_dir: str | None, dense_base: str | None) -> bool:
    """Whether the draft's recorded base names the dense model (a hub id, or the same directory)."""
    if not draft_base:
        return False
    candidates = {value for value in (dense_dir, dense_base) if value}
    resolved = {
        str(Path(value).expanduser().resolve()) for value in candidates if Path(value).expanduser().exists()
    }
    base_path = Path(draft_base).expanduser()
    return draft_base in candidates or (base_path.exists() and str(base_path.resolve()) in resolved)


def vocab_size(directory: Path) -> int | None:
    """``vocab_size`` of a checkpoint's config.json (of its ``text_config`` for a multimodal one)."""
    config = read_json(directory / "config.json") or {}
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")


def read_json(path: Path) -> dict | None:
    """A JSON file's content, or None when there is none."""
    return json.loads(path.read_text()) if path.is_file() else None


def file_sha256(path: Path) -> str:
    """sha256 of one file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
