"""``depthprune experiments``: list, show, set, history and report the A/B experiments in the registry.

The commands work on the registry directly (no gateway needed); every gateway sharing that registry picks a
change up within about a second. ``report`` reads the gateways' Prometheus metrics. Examples::

    depthprune experiments list
    depthprune experiments set llama-ab --spec '{"arms": [{"objective": "ppl"}, {"variant": "dense"}]}'
    depthprune experiments set llama-ab --weight ppl=3 --weight dense=1 --if-version 2
    depthprune experiments set llama-ab --from-version 1        # roll back to what version 1 set
    depthprune experiments history llama-ab
    depthprune experiments report llama-ab --gateway http://gw-1:8000 --gateway http://gw-2:8000
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from ground.core.cli_options import cli, option_group, with_options
from ground.core.errors import UserError
from ground.core.options import JsonOptions, RegistryOptions

app = typer.Typer(
    help="List, show, change (with versions and history) and report the A/B experiments every gateway on "
    "the registry routes by.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _store(url: str | None):
    from registry.api import open_registry
    from registry.experiments import ExperimentStore

    return ExperimentStore(open_registry(url))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def _arms_text(spec: dict) -> str:
    total = sum(arm["weight"] for arm in spec["arms"]) or 1
    return ", ".join(
        f"{arm['name']}={arm.get('variant') or 'objective:' + arm['objective']} {arm['weight'] / total:.0%}"
        for arm in spec["arms"]
    )


@app.command("list")
@with_options
def list_command(where: RegistryOptions, output: JsonOptions) -> None:
    """The experiments in the registry with their arms, shares and versions."""
    store = _store(where.registry)
    try:
        records = store.records()
    finally:
        store.engine.dispose()
    if output.as_json:
        _print_json([{"name": r.name, "version": r.version, "spec": r.spec} for r in records])
        return
    from rich.table import Table

    table = Table("experiment", "version", "arms (share)", "updated", "by")
    for record in records:
        when = record.updated_at.strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(record.name, str(record.version), _arms_text(record.spec), when, record.updated_by)
    _console().print(table)


@app.command("show")
@with_options
def show_command(name: str, where: RegistryOptions) -> None:
    """One experiment: version, who changed it last, and its spec as JSON (what ``set --spec`` takes)."""
    store = _store(where.registry)
    try:
        record = store.get(name)
    finally:
        store.engine.dispose()
    _print_json(
        {
            "name": record.name,
            "version": record.version,
            "updated_at": record.updated_at.isoformat(),
            "updated_by": record.updated_by,
            "spec": record.spec,
        }
    )


def _read_spec(text: str) -> Any:
    """``--spec`` as JSON text, or ``@FILE`` (JSON or YAML)."""
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise UserError(f"--spec: no file {path}")
        text = path.read_text()
    import yaml

    try:
        return yaml.safe_load(text)  # YAML reads JSON too
    except yaml.YAMLError as error:
        raise UserError(f"--spec is neither JSON nor YAML: {str(error).splitlines()[0]}") from None


def _with_weights(name: str, spec: dict, weights: list[str]) -> dict:
    """``spec`` with the weights of ``ARM=W`` items changed."""
    arms = {arm["name"]: arm for arm in spec["arms"]}
    changed = json.loads(json.dumps(spec))
    by_name = {arm["name"]: arm for arm in changed["arms"]}
    for item in weights:
        arm, sep, value = item.partition("=")
        if not sep or arm not in arms:
            raise UserError(f"--weight {item!r}: give ARM=WEIGHT with an arm of {name!r}: {', '.join(arms)}")
        try:
            by_name[arm]["weight"] = float(value)
        except ValueError:
            raise UserError(f"--weight {item!r}: {value!r} is not a number") from None
    return changed


@option_group
@dataclass(frozen=True)
class SetOptions:
    """``experiments set``: the new spec (one of three ways) and the change's conditions."""

    spec: str | None = None
    """The whole spec: JSON text, or @FILE (JSON or YAML) with arms, ..."""
    weight: list[str] | None = None
    """Change one arm's weight, repeatable: --weight ppl=3."""
    from_version: int | None = None
    """Roll back: set again the spec that this version set."""
    if_version: int | None = None
    """Change only if the experiment is at this version (0: only create it)."""
    actor: str | None = None
    """Who makes the change, for the history [default: cli:USER@HOST]."""


@app.command("set")
@with_options
def set_command(name: str, options: SetOptions, where: RegistryOptions) -> None:
    """Create or change an experiment in the registry (a new version, recorded in its history).

    The spec is checked for its shape here; each gateway checks its arms against the variants it serves.
    """
    from server.experiment_sync import parse_spec, spec_json

    spec, weight, from_version = options.spec, options.weight, options.from_version
    if sum(option is not None and option != [] for option in (spec, weight, from_version)) != 1:
        raise UserError("give exactly one of --spec, --weight or --from-version")
    actor = options.actor or f"cli:{getpass.getuser()}@{socket.gethostname()}"
    store = _store(where.registry)
    try:
        if spec is not None:
            data = _read_spec(spec)
        elif from_version is not None:
            data = store.spec_at(name, from_version)
        else:
            data = _with_weights(name, store.get(name).spec, weight)
        try:
            checked = spec_json(parse_spec(name, data))
        except ValueError as error:
            raise UserError(str(error)) from None
        before = store.versions().get(name, 0)
        record = store.set(name, checked, actor=actor, expected_version=options.if_version)
    finally:
        store.engine.dispose()
    changed = "unchanged (same spec)" if record.version == before else f"now version {record.version}"
    print(f"experiment {name!r} {changed}: {_arms_text(record.spec)}", file=sys.stderr)


@app.command("history")
@with_options
def history_command(name: str, where: RegistryOptions, output: JsonOptions) -> None:
    """Every change of an experiment, oldest first: version, time, who, what it set."""
    store = _store(where.registry)
    try:
        changes = store.history(name)
    finally:
        store.engine.dispose()
    if not changes:
        raise UserError(f"experiment {name!r} has no history in the registry")
    if output.as_json:
        from dataclasses import asdict

        _print_json([asdict(change) for change in changes])
        return
    from rich.table import Table

    table = Table("version", "time", "action", "by", "arms (share)")
    for change in changes:
        arms = _arms_text(change.new_spec) if change.new_spec else "—"
        when = change.changed_at.strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(str(change.version), when, change.action, change.actor, arms)
    _console().print(table)


@option_group
@dataclass(frozen=True)
class ReportOptions:
    """``experiments report``: the gateways whose metrics are summed."""

    gateway: list[str]
    """Base URL of a gateway routing the experiment, repeatable (replicas)."""
    api_key: str | None = field(default=None, metadata=cli(envvar="DEPTHPRUNE_API_KEY"))
    """The gateways' API key, if they need one."""


@app.command("report")
@with_options
def report_command(name: str, options: ReportOptions, where: RegistryOptions, output: JsonOptions) -> None:
    """Per-arm requests, errors, TTFT/TPOT/E2EL (means and medians with 95 % intervals) summed over the
    gateways' metrics, and each arm's variant: objective, removed blocks, held-out quality."""
    from server.experiment_report import report

    result = report(name, options.gateway, api_key=options.api_key, registry_url=where.registry)
    if output.as_json:
        _print_json(result)
        return
    from server.experiment_report import print_report

    print_report(result, _console())
