"""Which variants running gateways serve: one lease file per gateway under ``DEPTHPRUNE_HOME/serving``.

``depthprune serve`` writes ``serving/gateway-<pid>.json`` (its pid, the process's start time, host, URL and
the variants with their checkpoint directories) before it starts a backend, and deletes it when it stops.
``depthprune variants rm --delete-checkpoint`` reads the leases and refuses to delete a checkpoint that a
gateway serves unless ``--force`` is given; a gateway whose checkpoint was deleted anyway keeps that backend
down at its next restart (its files no longer match the registry's manifest) instead of retrying for ever.

A gateway killed with ``kill -9`` cannot delete its lease: a lease whose process is gone (same host, no
such pid, or a pid now held by a process started at another time) is stale; readers ignore and delete it.
Leases are local to a ``DEPTHPRUNE_HOME``: a gateway started with another one is not seen, which is also
why this is a file and not a registry row (a managed backend's checkpoint is on the gateway's own disk).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from ground.core.files import write_text_atomically
from ground.core.settings import home_dir

__all__ = ["active_leases", "remove_lease", "serving_gateways", "write_lease"]


def leases_dir() -> Path:
    """``DEPTHPRUNE_HOME/serving``, created on first use."""
    path = home_dir() / "serving"
    path.mkdir(parents=True, exist_ok=True)
    return path


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (Linux ``/proc``); None when unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


def write_lease(variants: list[dict], *, url: str, pid: int | None = None) -> Path:
    """Record that the gateway ``pid`` (this process by default) serves ``variants``.

    Args:
        variants: one dict per served variant: ``name``, and ``variant_id``, ``checkpoint_path`` where known.
        url: where the gateway listens.
        pid: the gateway's process id.

    Returns:
        The lease file; :func:`remove_lease` deletes it.
    """
    pid = os.getpid() if pid is None else pid
    lease = {
        "pid": pid,
        "start_ticks": process_start_ticks(pid),
        "host": socket.gethostname(),
        "url": url,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "variants": variants,
    }
    path = leases_dir() / f"gateway-{pid}.json"
    write_text_atomically(path, json.dumps(lease, indent=2))  # readers never see half a lease
    return path


def remove_lease(path: Path) -> None:
    """Delete a lease (the gateway stopped); a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def is_live(lease: dict) -> bool:
    """Whether the gateway of ``lease`` still runs. One on another host cannot be checked: assumed live."""
    if lease.get("host") != socket.gethostname():
        return True
    pid = lease.get("pid")
    if not isinstance(pid, int):
        return False
    ticks = process_start_ticks(pid)
    if ticks is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return lease.get("start_ticks") is None  # no /proc here: the pid exists, trust it
    return lease.get("start_ticks") in (None, ticks)


def active_leases() -> list[dict]:
    """The leases of gateways that still run; stale ones are deleted on the way."""
    found = []
    for path in sorted(leases_dir().glob("gateway-*.json")):
        try:
            lease = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed right now
        if is_live(lease):
            found.append(lease)
        else:
            remove_lease(path)
    return found


def serving_gateways(checkpoint_path: str) -> list[dict]:
    """The live leases that serve a checkpoint in the directory ``checkpoint_path``.

    Matched by directory, not by variant id: ids are per registry, and gateways of one ``DEPTHPRUNE_HOME``
    may serve variants of several registries; the directory is what a deletion takes away.
    """
    wanted = Path(checkpoint_path).expanduser().resolve()

    def serves(entry: dict) -> bool:
        path = entry.get("checkpoint_path")
        return isinstance(path, str) and Path(path).expanduser().resolve() == wanted

    return [lease for lease in active_leases() if any(serves(entry) for entry in lease.get("variants", []))]
