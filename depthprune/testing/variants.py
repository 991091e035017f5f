"""An example registered variant: a base model and a pruned variant of it in a registry, as tests need them.

Tests of the registry's command line, of ``serve`` and of the load test need a registry that holds
something; these write it with plausible search facts, so that each test states only what it checks::

    with open_registry(url) as registry:
        register_example_base(registry)
        checkpoint = fake_checkpoint(tmp_path / "variant")
        variant = register_example_variant(registry, checkpoint=checkpoint, alias="ppl-best")

Nothing here needs torch but :func:`registry_with_pruned_variant`, which writes a real pruned checkpoint for
the tests of real engines: :func:`fake_checkpoint` is a directory that the weights checksum accepts.
"""

from __future__ import annotations

from pathlib import Path

from ground.core.checksums import weights_sha256
from registry.records import BaseModelInfo, VariantInfo, VariantRecord

__all__ = [
    "EXAMPLE_BASE",
    "EXAMPLE_CALIBRATION",
    "fake_checkpoint",
    "register_example_base",
    "register_example_variant",
    "registry_with_pruned_variant",
]

EXAMPLE_BASE = "org/tiny-base"
"""Hub id of the example base model (nothing is downloaded: the registry only records it)."""

EXAMPLE_CALIBRATION = {"objective": "perplexity", "data": "demo:text", "samples": 4, "seq_len": 32, "seed": 0}
"""A calibration configuration as ``prune`` records it."""


def fake_checkpoint(directory: Path, content: bytes = b"weights") -> Path:
    """A directory that looks like a pruned checkpoint to the weights checksum (no torch needed).

    Args:
        directory: where to make it (parents are created).
        content: the bytes of its ``model.safetensors``; other bytes give another checksum.

    Returns:
        ``directory``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(content)
    (directory / "pruning.json").write_text("{}")
    return directory


def register_example_base(
    registry, model: str = EXAMPLE_BASE, *, num_blocks: int = 6, **overrides
) -> BaseModelInfo:
    """Register a llama base model of ``num_blocks`` blocks with a made-up weights checksum.

    Args:
        registry: an open :class:`registry.Registry`.
        model: hub id or local directory.
        num_blocks: its number of decoder blocks.
        **overrides: other ``register_base_model`` arguments (``revision``, ``weights_sha256``, ...).

    Returns:
        The registered base model.
    """
    fields = dict(revision=None, weights_sha256="b" * 64, num_blocks=num_blocks, architecture="llama")
    return registry.register_base_model(model, **{**fields, **overrides})


def register_example_variant(
    registry,
    removed_blocks: list[int] | tuple[int, ...] = (1, 3),
    *,
    base_model: str = EXAMPLE_BASE,
    checkpoint: Path | None = None,
    alias: str | None = None,
    **overrides,
) -> VariantInfo:
    """Register a greedy-search variant of ``base_model`` that removed ``removed_blocks``.

    Args:
        registry: an open :class:`registry.Registry` where ``base_model`` is registered.
        removed_blocks: the removed blocks.
        base_model: the base model it was pruned from.
        checkpoint: its checkpoint directory (e.g. :func:`fake_checkpoint`), recorded with its checksum;
            None records none.
        alias: an alias to point at it, if any.
        **overrides: other :class:`registry.records.VariantRecord` fields (``calibration``, ``search``,
            ``calibration_loss``, ...).

    Returns:
        The registered variant.
    """
    fields = dict(
        base_model=base_model,
        removed_blocks=list(removed_blocks),
        calibration=dict(EXAMPLE_CALIBRATION),
        search="greedy",
        search_options={},
        calibration_loss=3.5,
        dense_loss=3.0,
        search_seconds=1.5,
        block_forwards=100,
        subset_evaluations=10,
        checkpoint_path=None if checkpoint is None else str(checkpoint),
        checkpoint_sha256=None if checkpoint is None else weights_sha256(checkpoint),
    )
    variant = registry.register_variant(VariantRecord(**{**fields, **overrides}))
    if alias is not None:
        registry.set_alias(alias, variant.name)
    return variant


def registry_with_pruned_variant(dense: Path, work: Path, removed: list[int], alias: str) -> str:
    """A SQLite registry at ``work/registry.db`` holding the real checkpoint ``dense`` as base and its
    variant without ``removed`` (written by the pruning code under ``work``), aliased ``alias``: what the
    tests of real vLLM engines serve.

    Returns:
        The registry's URL.
    """
    from pruning.model.checkpoint import write_pruned_checkpoint
    from registry import open_registry

    directory = work / f"pruned-{'-'.join(map(str, removed))}"
    pruned = write_pruned_checkpoint(str(dense), removed, directory, calibration=EXAMPLE_CALIBRATION)
    import json

    url = f"sqlite:///{work / 'registry.db'}"
    num_blocks = json.loads((dense / "config.json").read_text())["num_hidden_layers"]
    with open_registry(url) as registry:
        register_example_base(
            registry, str(dense), num_blocks=num_blocks, weights_sha256=weights_sha256(dense)
        )
        register_example_variant(
            registry, removed, base_model=str(dense), checkpoint=Path(pruned.path), alias=alias
        )
    return url
