"""``depthprune variants``: list, show, compare, alias, export and remove registered variants.

Every command reads the registry named by ``--registry URL`` (default: ``DEPTHPRUNE_REGISTRY_URL``,
else the SQLite file under ``DEPTHPRUNE_HOME``), prints rich tables, and prints JSON with ``--json``.
Examples::

    depthprune variants list
    depthprune variants show ppl-best
    depthprune variants compare dense ppl-best margin-best
    depthprune variants alias ppl-best llama-3-8b-ppl-greedy-m7-1a2b3c
    depthprune variants export --out registry.csv --format csv
    depthprune variants rm llama-3-8b-ppl-greedy-m7-1a2b3c --delete-checkpoint
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ground.core.cli_options import cli, option_group, with_options
from ground.core.errors import UserError
from ground.core.options import JsonOptions, RegistryOptions
from registry.naming import display_number

if TYPE_CHECKING:
    from rich.table import Table

    from registry.records import VariantInfo

app = typer.Typer(
    help="List, inspect, compare, alias, export and remove the pruned variants in the registry.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _open(url: str | None):
    from registry.api import open_registry

    return open_registry(url)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _console():
    import sys

    from rich.console import Console

    # Piped output has no width: use a wide one rather than squeezing columns into nothing.
    return Console(width=None if sys.stdout.isatty() else 240)


def _short_model(model: str) -> str:
    from registry.naming import model_slug

    return model_slug(model)


@option_group
@dataclass(frozen=True)
class ListOptions:
    """``variants list``: which variants."""

    base: str | None = None
    """Only the variants of this base model."""
    dense: bool = True
    """Show each base model's dense model as well."""


@app.command("list")
@with_options
def list_command(options: ListOptions, where: RegistryOptions, output: JsonOptions) -> None:
    """List the registered variants: removed blocks, calibration, search, losses, aliases."""
    with _open(where.registry) as registry:
        variants = registry.list_variants(options.base, include_dense=options.dense)
    if output.as_json:
        _print_json([variant.to_dict() for variant in variants])
        return
    from rich.table import Table

    if not variants:
        _console().print("No variants registered yet; `depthprune prune` creates them.")
        return
    table = Table(title="Variants", header_style="bold")
    for column in (
        "id",
        "name",
        "base",
        "blocks",
        "mask",
        "objective",
        "data",
        "search",
        "cal. loss",
        "dense loss",
        "search s",
        "val. loss",
        "fit",
        "aliases",
    ):
        table.add_column(column, no_wrap=column in ("name", "mask"), min_width=min(len(column), 8))
    for variant in variants:
        table.add_row(
            display_number(variant.id),
            variant.name,
            _short_model(variant.base_model),
            f"{variant.num_blocks - variant.num_removed}/{variant.num_blocks}",
            variant.mask(),
            display_number(variant.objective),
            display_number(variant.calibration.get("data")),
            variant.search if variant.healing is None else f"{variant.search}+{variant.healing['method']}",
            display_number(variant.calibration_loss),
            display_number(variant.dense_loss),
            display_number(variant.search_seconds, 3),
            display_number((variant.quality or {}).get("validation_loss")),
            display_number(variant.fit),
            ", ".join(variant.aliases),
        )
    _console().print(table)


def _evaluation_cells(item) -> tuple[str, str]:
    """An evaluation's value with its stored 95 % interval, and its settings without the per-item scores
    (``statistics.items``: hundreds of keys that belong in ``--json``, not in a table)."""
    statistics = item.settings.get("statistics") or {}
    ci95 = statistics.get("perplexity_ci95" if item.metric == "perplexity" else "accuracy_ci95")
    value = display_number(item.value, 6)
    if ci95:
        value += f" [{display_number(ci95[0], 4)}, {display_number(ci95[1], 4)}] n={statistics.get('n')}"
    settings = {key: value_ for key, value_ in item.settings.items() if key != "statistics"}
    if statistics:
        settings["statistics"] = {key: value_ for key, value_ in statistics.items() if key != "items"}
    return value, json.dumps(settings, sort_keys=True)


def _variant_fields(variant: VariantInfo, healed: list[VariantInfo]) -> Table:
    """The one-variant table of ``variants show``: every recorded field, lineage included."""
    from rich.table import Table

    fields = Table(title=f"Variant {variant.name}", show_header=False)
    fields.add_column("field", style="bold")
    fields.add_column("value", overflow="fold")
    fields.add_row("id", display_number(variant.id))
    fields.add_row(
        "base model", f"{variant.base_model} ({variant.architecture}, revision {variant.base_revision})"
    )
    fields.add_row("removed blocks", " ".join(map(str, variant.removed_blocks)) or "none")
    fields.add_row("mask (■ kept, □ removed)", variant.mask())
    fields.add_row("kept → original", " ".join(map(str, variant.kept_to_original)))
    fields.add_row("calibration", json.dumps(variant.calibration, sort_keys=True))
    fields.add_row("search", f"{variant.search} {json.dumps(variant.search_options, sort_keys=True)}")
    fields.add_row("calibration loss", display_number(variant.calibration_loss, 6))
    fields.add_row("dense loss", display_number(variant.dense_loss, 6))
    fields.add_row("search time (s)", display_number(variant.search_seconds))
    fields.add_row("block forwards", display_number(variant.block_forwards))
    fields.add_row("subset evaluations", display_number(variant.subset_evaluations))
    fields.add_row("fit (quality gate)", display_number(variant.fit))
    if variant.quality is not None:
        fields.add_row("quality", json.dumps(variant.quality, sort_keys=True))
    if variant.healing is not None:
        from registry.compare import healing_summary

        parent = "— (removed)" if variant.parent is None else f"{variant.parent} (id {variant.parent_id})"
        fields.add_row("healed from", parent)
        fields.add_row("healing", healing_summary(variant.healing))
        fields.add_row("healing record", json.dumps(variant.healing, sort_keys=True))
    if healed:
        fields.add_row("healed variants", ", ".join(item.name for item in healed))
    fields.add_row("checkpoint", display_number(variant.checkpoint_path))
    fields.add_row("checkpoint sha256", display_number(variant.checkpoint_sha256))
    fields.add_row("aliases", ", ".join(variant.aliases) or "—")
    fields.add_row("created", display_number(variant.created_at))
    fields.add_row("versions", " ".join(f"{key}={value}" for key, value in variant.versions.items()) or "—")
    return fields


@app.command("show")
@with_options
def show(
    name: Annotated[str, typer.Argument(help="Variant id, name, alias, 'dense' or NAME@BASE.")],
    where: RegistryOptions,
    output: JsonOptions,
) -> None:
    """Show everything recorded about one variant, with its evaluations and serving benchmarks."""
    with _open(where.registry) as registry:
        variant = registry.resolve(name)
        evaluations = registry.evaluations(variant)
        benchmarks = registry.serving_benchmarks(variant)
        healed = registry.healed_from(variant)
    if output.as_json:
        _print_json(
            {
                "variant": variant.to_dict(),
                "healed_variants": [item.name for item in healed],
                "evaluations": [item.to_dict() for item in evaluations],
                "serving_benchmarks": [item.to_dict() for item in benchmarks],
            }
        )
        return
    from rich.table import Table

    console = _console()
    console.print(_variant_fields(variant, healed))
    if evaluations:
        table = Table(title="Evaluations", header_style="bold")
        for column in ("suite", "task", "metric", "value", "settings", "when"):
            table.add_column(column)
        for item in evaluations:
            table.add_row(
                item.suite,
                item.task,
                item.metric,
                *_evaluation_cells(item),
                item.created_at.strftime("%Y-%m-%d %H:%M"),
            )
        console.print(table)
    if benchmarks:
        from registry.compare import LATENCY_METRICS, load_summary

        table = Table(title="Serving benchmarks (newest first)", header_style="bold")
        for column in ("when", "hardware", "load", *(label for _, label in LATENCY_METRICS)):
            table.add_column(column)
        for item in benchmarks:
            table.add_row(
                item.created_at.strftime("%Y-%m-%d %H:%M"),
                item.hardware,
                load_summary(item) or "—",
                *(display_number(item.metrics.get(key)) for key, _ in LATENCY_METRICS),
            )
        console.print(table)


@option_group
@dataclass(frozen=True)
class CompareOptions:
    """``variants compare``: which variants when none are named."""

    base: str | None = None
    """With no NAMES: the variants of this base model."""


@app.command("compare")
@with_options
def compare(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Variants to compare (id, name, alias, 'dense'); default: all, dense first."),
    ] = None,
    *,
    options: CompareOptions,
    where: RegistryOptions,
    output: JsonOptions,
) -> None:
    """Put variants side by side: mask, calibration, losses, evaluation scores and serving latency."""
    from registry.compare import compare_variants, comparison_rows

    with _open(where.registry) as registry:
        if names:
            references = list(names)
        else:
            references = registry.list_variants(options.base, include_dense=True)
            if not any(not variant.is_dense for variant in references):
                raise UserError("no variants to compare yet; `depthprune prune` creates them")
        entries = compare_variants(registry, references)
    if output.as_json:
        _print_json(entries)
        return
    from rich.table import Table

    rows = comparison_rows(entries)
    table = Table(title="Variants side by side", header_style="bold")
    # the labels keep their width; a value too long for the terminal folds onto more lines, never cut short
    table.add_column("", style="bold", no_wrap=True, min_width=max(len(label) for label, _ in rows))
    for entry in entries:
        table.add_column(entry["variant"]["name"], overflow="fold")
    for label, cells in rows:
        table.add_row(label, *cells)
    _console().print(table)


@option_group
@dataclass(frozen=True)
class AliasOptions:
    """``variants alias``: delete the alias, or point it at the best variant of an objective."""

    delete: bool = field(default=False, metadata=cli("--delete"))
    """Remove the alias."""
    best: str | None = field(default=None, metadata=cli(metavar="OBJECTIVE"))
    """Point ALIAS (default <short>-best, e.g. ce-best) at the variant with the lowest validation loss among
    those whose search used this objective (never block_influence, lorp, streamline) and their patched
    children (heal --method patch; never lora, distill, last-blocks)."""
    base: str | None = None
    """--best: the base model (when several have variants)."""


@app.command("alias")
@with_options
def alias(
    alias_name: Annotated[
        str | None,
        typer.Argument(metavar="ALIAS", help="The alias, e.g. ppl-best (ALIAS@BASE to pick a base)."),
    ] = None,
    variant: Annotated[
        str | None, typer.Argument(help="Variant to point it at (id, name, 'dense'); omit to show it.")
    ] = None,
    *,
    options: AliasOptions,
    where: RegistryOptions,
    output: JsonOptions,
) -> None:
    """Set, show or delete an alias (per base model); with no ALIAS, list every alias."""
    delete, best, as_json = options.delete, options.best, output.as_json
    if delete and (alias_name is None or variant is not None):
        raise UserError("--delete takes the alias only: depthprune variants alias ALIAS --delete")
    if best is not None and (delete or variant is not None):
        raise UserError(
            "--best chooses the variant itself: depthprune variants alias [ALIAS] --best OBJECTIVE"
        )
    with _open(where.registry) as registry:
        if best is not None:
            from ground.core.objectives import best_alias
            from registry.selection import best_for_objective

            alias_name = alias_name or best_alias(best)
            variant = best_for_objective(registry, best, options.base).name
        if alias_name is None:
            aliases = registry.aliases()
            if as_json:
                _print_json(aliases)
            elif not aliases:
                _console().print("No aliases yet; set one with `depthprune variants alias ALIAS VARIANT`.")
            else:
                for qualified, target in aliases.items():
                    print(f"{qualified} -> {target}")
            return
        if delete:
            registry.remove_alias(alias_name)
            if as_json:
                _print_json({"alias": alias_name, "deleted": True})
            else:
                print(f"deleted alias {alias_name}")
            return
        target = registry.resolve(alias_name) if variant is None else registry.set_alias(alias_name, variant)
    if as_json:
        _print_json({"alias": alias_name, "variant": target.to_dict()})
    else:
        print(
            f"{alias_name} -> {target.name} ({_short_model(target.base_model)}, removed "
            f"{' '.join(map(str, target.removed_blocks)) or 'none'})"
        )


@option_group
@dataclass(frozen=True)
class ExportOptions:
    """``variants export``: where, in which format, which base model."""

    out: Path | None = None
    """File to write (default: standard output)."""
    export_format: str = field(default="json", metadata=cli("--format"))
    """json (everything) or csv (one row per variant)."""
    base: str | None = None
    """Only this base model and its variants."""


@app.command("export")
@with_options
def export(options: ExportOptions, where: RegistryOptions, output: JsonOptions) -> None:
    """Export every variant with its evaluations and serving benchmarks as JSON or CSV."""
    from ground.core.files import write_text_atomically
    from registry.export import FORMATS, export_document, render_export

    out, export_format = options.out, options.export_format
    if export_format not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {export_format!r}")
    if out is not None and out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name")
    with _open(where.registry) as registry:
        document = export_document(registry, options.base, progress=True)
    text = render_export(document, export_format)
    if out is None:
        print(text, end="")
        return
    write_text_atomically(out, text)
    summary = {"path": str(out), "format": export_format, "variants": len(document["variants"])}
    if output.as_json:
        _print_json(summary)
    else:
        print(f"wrote {summary['variants']} variants (dense models included) to {out} as {export_format}")


@option_group
@dataclass(frozen=True)
class RemoveOptions:
    """``variants rm``: the checkpoints too, and whether a served one may go."""

    delete_checkpoint: bool = False
    """Also delete each variant's checkpoint directory (one holding pruning.json)."""
    force: bool = False
    """With --delete-checkpoint: delete it even while a running gateway serves the variant (the gateway keeps
    that variant down from its next restart)."""


@app.command("rm")
@with_options
def remove(
    names: Annotated[list[str], typer.Argument(help="Variants to remove, by id or name (not by alias).")],
    options: RemoveOptions,
    where: RegistryOptions,
    output: JsonOptions,
) -> None:
    """Remove variants with their aliases, evaluations and serving benchmarks.

    A checkpoint that a running gateway (``depthprune serve`` with this DEPTHPRUNE_HOME) serves is not
    deleted without --force.
    """
    delete_checkpoint, force = options.delete_checkpoint, options.force
    with _open(where.registry) as registry:
        # Resolve every name first, so that a typo in the third name (or a served one) removes nothing.
        for name in names:
            registry.resolve(name)
            if delete_checkpoint and not force:
                registry.refuse_if_served(name)
        removed = [
            registry.remove_variant(name, delete_checkpoint=delete_checkpoint, force=force) for name in names
        ]
    if output.as_json:
        _print_json([variant.to_dict() for variant in removed])
        return
    for variant in removed:
        checkpoint = " and its checkpoint" if delete_checkpoint and variant.checkpoint_path else ""
        print(f"removed {variant.name} (id {variant.id}){checkpoint}")
