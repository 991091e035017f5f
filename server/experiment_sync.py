"""The gateway's experiments kept in step with the registry, so that every replica routes the same way.

:class:`SharedExperiments` owns the experiments of one gateway. With a registry
(``GatewaySettings.experiments_registry``) the registry holds them (:mod:`registry.experiments`); the gateway
routes on its own compiled copy in the :class:`~server.experiments.Router`, and a background task keeps
that copy current:

* **Convergence.** Every ``poll_interval_s`` (1 s) it reads ``{name: version}`` of every experiment, one
  small query, and loads and compiles the ones whose version moved. On PostgreSQL a LISTEN connection
  (:class:`registry.experiments.ChangeListener`) wakes it at once on every change as well.
* **Routing never waits for the database.** Requests read the router's in-memory copy only; the database
  is read in worker threads. When it cannot be reached the gateway keeps routing on the last good copy and
  says so: ``/ready`` shows ``experiments.in_sync: false`` with the error (readiness itself stays as the
  backends say: pulling every replica out of the load balancer because the registry blinked would be worse),
  and ``depthprune_gateway_experiments_in_sync`` drops to 0 as soon as a sync fails or outlives
  ``READ_TIMEOUT_S``. A gateway that has never read the registry has no last good copy: it is not ready, and
  answers 503 with ``Retry-After`` for every name that is not a variant (it may be an experiment).
* **Writes go to the registry first, and their answer is true.** An admin ``PUT`` is checked
  (:func:`parse_spec`, the one check of every writer) and against what this gateway serves, then written with
  the expected version (``If-Match``) under one deadline for the whole transaction, then installed here. A 503
  means the transaction was rolled back and nothing changed anywhere; the gateway waits for the worker to say
  so rather than answer while it may still commit.
* **The config file seeds.** At start, each experiment of ``experiments:`` that the registry does not know is
  created (a ``seed`` in its history); one it knows is kept as the registry has it, with a warning when they
  differ, so a restart never undoes a runtime change.

An experiment in the registry that this gateway cannot serve (an arm names a variant it does not front) is
left out here and listed under ``/ready`` ``experiments.not_served``; the other replicas still route it.
Without a registry the experiments live in this process only, with the same versions and history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError

from ground.core.errors import UserError
from registry.experiments import WRITE_DEADLINE_S, OutcomeUnknown, check_experiment_name
from server.errors import validation_problems
from server.experiments import Experiment, Router
from server.protocol import ExperimentSpec

log = logging.getLogger("depthprune.server")
READ_TIMEOUT_S = 3.0
"""Longest a read of the registry (a sync, the history) may take before the gateway counts the registry as
unreachable: reads change nothing, so giving up on one is always true to say."""
WRITE_GRACE_S = 5.0
"""How long past a change's own deadline the gateway still waits for the worker to say what happened; only a
database that hangs in COMMIT gets there, and then the outcome is unknown and said so."""


class StoreUnavailable(Exception):
    """The registry could not be reached; nothing was changed."""


class LocalStore:
    """Experiments in this process only (a gateway without a registry): versions and history, not shared."""

    postgres = False

    def __init__(self):
        self._records: dict[str, Any] = {}
        self._history: dict[str, list] = {}

    def versions(self) -> dict[str, int]:
        return {name: record.version for name, record in self._records.items()}

    def records(self, names=None, *, deleted=False):
        return [
            record
            for name, record in sorted(self._records.items())
            if (names is None or name in names) and (deleted or not record.deleted)
        ]

    def history(self, name: str) -> list:
        return list(self._history.get(name, []))

    def set(self, name, spec, *, actor, expected_version=None, action="set", deadline_s=None, reason=None):
        from registry.experiments import (
            MAX_EXPERIMENTS,
            CaseClash,
            ExperimentChange,
            ExperimentNotFound,
            ExperimentRecord,
            StaleVersion,
            TooManyExperiments,
            case_clash,
        )

        current = self._records.get(name)
        version = current.version if current else 0
        if expected_version is not None and expected_version != version:
            raise StaleVersion(name, expected_version, version)
        old = current.spec if current else None
        if action == "delete" and old is None:
            raise ExperimentNotFound(name)
        if current is not None and old == spec:
            return current
        live = sum(not record.deleted for record in self._records.values())
        if old is None and spec is not None and live >= MAX_EXPERIMENTS:
            raise TooManyExperiments(name, live)
        clash = case_clash(name, [other for other, record in self._records.items() if not record.deleted])
        if old is None and spec is not None and clash is not None:
            raise CaseClash(name, clash)
        now = datetime.now(timezone.utc)
        record = ExperimentRecord(name, spec, version + 1, actor, now)
        self._records[name] = record
        change = ExperimentChange(name, version + 1, action, actor, old, spec, now, reason)
        self._history.setdefault(name, []).append(change)
        return record

    def delete(self, name, *, actor, expected_version=None, deadline_s=None):
        return self.set(name, None, actor=actor, expected_version=expected_version, action="delete")

    def seed(self, name, spec, *, actor, deadline_s=None):
        return None if name in self._records else self.set(name, spec, actor=actor, action="seed")


class SyncMetrics:
    """The gauges that say whether this gateway routes on the registry's current experiments."""

    def __init__(self, registry: CollectorRegistry):
        prefix = "depthprune_gateway_experiments_"
        self.in_sync = Gauge(
            prefix + "in_sync",
            "1 while the experiments match the registry's (last sync succeeded); 0 while routing on the last "
            "good copy because the registry cannot be read.",
            registry=registry,
        )
        self.sync_age = Gauge(
            prefix + "sync_age_seconds",
            "Seconds since the experiments were last read from the registry successfully.",
            registry=registry,
        )
        self.sync_errors = Counter(
            prefix + "sync_errors", "Failed reads of the registry's experiments.", registry=registry
        )
        self.version = Gauge(
            "depthprune_gateway_experiment_version",
            "Version of each experiment this gateway routes by (the registry's, equal on every replica).",
            ["experiment"],
            registry=registry,
        )


def parse_spec(name: str, data: Any) -> ExperimentSpec:
    """An experiment's name and spec checked, the one check every writer and reader goes through (admin API,
    ``depthprune experiments set``, a config file, a gateway loading the registry's).

    Raises:
        ValueError: the name or the spec is not valid (the message names the field).
    """
    try:
        check_experiment_name(name)
    except UserError as error:
        raise ValueError(str(error)) from None
    try:
        return data if isinstance(data, ExperimentSpec) else ExperimentSpec.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"experiment {name!r}: {validation_problems(error)}") from None


def spec_json(spec: ExperimentSpec) -> dict[str, Any]:
    """The form a spec is stored in (arm names filled in, every field written)."""
    return spec.model_dump(mode="json")


class SharedExperiments:
    """The experiments of one gateway: the router's compiled copy, kept in step with the store."""

    def __init__(
        self,
        router: Router,
        metrics_registry: CollectorRegistry,
        *,
        registry_url: str | None = None,
        seed: dict[str, ExperimentSpec] | None = None,
        actor: str = "gateway",
        poll_interval_s: float = 1.0,
        forget: Callable[[str, set[str] | None], None] | None = None,
    ):
        """
        Args:
            router: the router whose experiments this keeps (its config experiments already installed).
            metrics_registry: where the sync gauges go (the gateway's).
            registry_url: the registry shared with other gateways; None keeps experiments in this process.
            seed: the config file's experiments, written to the registry when it does not know them.
            actor: how this gateway signs its changes in the history (``... via gateway HOST:PORT``).
            poll_interval_s: seconds between version polls.
            forget: called with (experiment, arms) when those arms stop being routed here, and with
                (experiment, None) when the whole experiment does, so that their metric series go too.
        """
        self.router, self.registry_url, self.actor = router, registry_url, actor
        self.poll_interval_s = poll_interval_s
        self.read_timeout_s = READ_TIMEOUT_S
        self.write_deadline_s = WRITE_DEADLINE_S
        self.seed_specs = dict(seed or {})
        self.forget = forget or (lambda experiment, arms: None)
        self.metrics = SyncMetrics(metrics_registry)
        self.metrics.sync_age.set_function(self._sync_age)
        self.store: Any = None if registry_url else LocalStore()
        self.versions: dict[str, int] = {}
        """Version of each experiment installed in the router."""
        self.not_served: dict[str, str] = {}
        """Experiments of the registry this gateway cannot route, with the reason."""
        self.error: str | None = None
        """Why the last read of the registry failed; None while in sync."""
        self.last_sync = time.monotonic()
        self._seen: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._pending: asyncio.Future | None = None
        self._stopping = False
        self._listener = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Database calls run here, not in the default executor: a hung registry must not starve the rest.
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="experiments")
        if self.store is not None:
            for name, spec in self.seed_specs.items():
                self._installed(name, self.store.seed(name, spec_json(spec), actor=f"config via {actor}"))
        else:  # nothing is routed by experiment until the registry has been read once
            router.experiments_pending = "the registry has not been read yet"
        self.metrics.in_sync.set(1 if self.synced else 0)

    @property
    def synced(self) -> bool:
        """Whether this gateway has its experiments from the store (at least once since it started)."""
        return self.router.experiments_pending is None

    # ---------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Open the registry, seed it, load its experiments, then keep them current in the background.

        A registry that cannot be reached does not stop the gateway: it serves its variants, is not ready,
        and answers requests for experiments with 503 until the registry has been read once.
        """
        self._loop = asyncio.get_running_loop()
        if self.registry_url is not None:
            await self.sync()
            self._task = asyncio.create_task(self._poll_forever())

    async def stop(self) -> None:
        """Stop the background task and the listener, release the registry."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=self.read_timeout_s)
        if self._listener is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._listener.stop)
        if self.store is not None and hasattr(self.store, "engine"):
            self.store.engine.dispose()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _open_and_seed(self) -> None:
        from registry.api import open_registry
        from registry.experiments import ChangeListener, ExperimentStore

        if self.store is None:
            try:
                registry = open_registry(self.registry_url)
            except UserError as error:  # it does not connect (now)
                raise StoreUnavailable(str(error)) from None
            self.store = ExperimentStore(registry)
            self._listener = ChangeListener(self.store, self._notified).start()
        for name, spec in self.seed_specs.items():
            try:
                seeded = self.store.seed(
                    name, spec_json(spec), actor=f"config via {self.actor}", deadline_s=self.write_deadline_s
                )
            except UserError as error:  # no room left: routed here only, from the config
                log.warning("experiment %r is not shared through the registry: %s", name, error)
                continue
            if seeded is None:
                kept = self.store.records([name], deleted=True)
                if kept and kept[0].spec != spec_json(spec):
                    log.warning(
                        "experiment %r: the registry's version %d is kept; the config file's differs "
                        "(change it with `depthprune experiments set` or PUT /admin/experiments/%s)",
                        name,
                        kept[0].version,
                        name,
                    )
        self.seed_specs = {}  # seeded once; after a failure all are seeded again (seeding is idempotent)

    def _notified(self, name: str) -> None:
        """A NOTIFY arrived (listener thread): poll now."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def _poll_forever(self) -> None:
        # asyncio.wait, not wait_for: Python 3.11's wait_for can swallow the cancellation that stops this.
        while not self._stopping:
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=self.poll_interval_s)
            finally:
                waiter.cancel()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.sync()
            except Exception:  # a bug must not end convergence for the life of the gateway
                log.exception("refreshing the experiments failed")

    async def sync(self) -> None:
        """Install every experiment whose version moved in the store since the last sync.

        One sync runs at a time: one that outlives :attr:`read_timeout_s` marks this gateway out of sync at
        once and is waited for again by the next call, not started a second time.
        """
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = loop.run_in_executor(self._executor, self._read_changes, dict(self._seen))
        done, _ = await asyncio.wait({self._pending}, timeout=self.read_timeout_s)
        if not done:
            self._failed(f"the registry did not answer within {self.read_timeout_s:g} s")
            return
        finished, self._pending = self._pending, None
        try:
            records = finished.result()
        except StoreUnavailable as error:
            self._failed(str(error))
            return
        for record in records:
            self._installed(record.name, record)
        self.last_sync = time.monotonic()
        if self.error is not None:
            log.warning("experiments: the registry answers again; in sync")
        self.error = None
        self.router.experiments_pending = None
        self.metrics.in_sync.set(1)

    def _read_changes(self, seen: dict[str, int]) -> list:
        """(worker thread) Open and seed the store when needed, then the records whose version moved."""
        try:
            if self.store is None or self.seed_specs:
                self._open_and_seed()
            versions = self.store.versions()
            moved = [name for name, version in versions.items() if seen.get(name) != version]
            return self.store.records(moved, deleted=True) if moved else []
        except DBAPIError as error:
            raise StoreUnavailable(_unreachable(error)) from None

    async def _call(self, function, *args, timeout_s: float, **kwargs):
        """``function(*args, **kwargs)`` in a worker thread, with registry failures as StoreUnavailable.

        Raises:
            StoreUnavailable: the registry failed, or gave no answer within ``timeout_s`` (for reads only:
                a write's own deadline ends it first).
        """
        if isinstance(self.store, LocalStore):
            return function(*args, **kwargs)  # in memory: instant, and kept on one thread
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, lambda: function(*args, **kwargs))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            raise StoreUnavailable(f"the registry did not answer within {timeout_s:g} s") from None
        except DBAPIError as error:
            raise StoreUnavailable(_unreachable(error)) from None

    async def _write(self, function, *args, **kwargs):
        """A change in a worker thread under :attr:`write_deadline_s`; see :meth:`put` for what it says."""
        from registry.experiments import WriteTimeout

        try:
            return await self._call(
                function,
                *args,
                timeout_s=self.write_deadline_s + WRITE_GRACE_S,
                deadline_s=self.write_deadline_s,
                **kwargs,
            )
        except WriteTimeout as error:
            raise StoreUnavailable(str(error)) from None
        except DBAPIError as error:  # raised in the thread before COMMIT: rolled back
            raise StoreUnavailable(_unreachable(error)) from None
        except StoreUnavailable as error:
            if "did not answer within" in str(error):
                raise OutcomeUnknown(
                    f"the registry did not say within {self.write_deadline_s + WRITE_GRACE_S:g} s whether "
                    "the change committed; read the experiment's version before trying again"
                ) from None
            raise

    def _opened_store(self):
        """The store, for a change or a read of the history.

        Raises:
            StoreUnavailable: the registry has not been reached since this gateway started.
        """
        if self.store is None or not self.synced:
            raise StoreUnavailable(f"the registry has not been read since start: {self.error}")
        return self.store

    def _failed(self, reason: str) -> None:
        if self.error is None:
            fallback = "routing on the last good copy" if self.synced else "not ready until it answers"
            log.warning("experiments: %s; %s", reason, fallback)
        self.error = reason
        if not self.synced:
            self.router.experiments_pending = reason
        self.metrics.in_sync.set(0)
        self.metrics.sync_errors.inc()

    def _sync_age(self) -> float:
        return time.monotonic() - self.last_sync

    # ---------------------------------------------------------------- following the store

    def _installed(self, name: str, record) -> None:
        """Make the router route ``name`` as ``record`` says, unless it already has that version or newer."""
        if record is None:
            return
        self._seen[name] = max(self._seen.get(name, 0), record.version)
        if self.versions.get(name, 0) >= record.version:
            return
        before = self.router.experiments.get(name)
        if record.deleted:
            if before is not None:
                self.router.remove_experiment(name)
            self.not_served.pop(name, None)
            self.versions[name] = record.version  # remembered, so that an older copy cannot come back
            with contextlib.suppress(KeyError):
                self.metrics.version.remove(name)
            self.forget(name, None)
            return
        try:
            experiment = self.router.set_experiment(name, parse_spec(name, record.spec))
        except ValueError as error:
            self.not_served[name] = str(error)
            log.warning("experiment %r (version %d) is not routed here: %s", name, record.version, error)
            return
        self.not_served.pop(name, None)
        self.versions[name] = record.version
        self.metrics.version.labels(name).set(record.version)
        if before is not None and set(before.by_name) - set(experiment.by_name):
            self.forget(name, set(before.by_name) - set(experiment.by_name))

    # ---------------------------------------------------------------- the admin API

    def version(self, name: str) -> int | None:
        """The version of ``name`` this gateway routes by; None when it routes no such experiment."""
        return self.versions.get(name) if name in self.router.experiments else None

    async def put(
        self,
        name: str,
        spec: ExperimentSpec,
        *,
        actor: str,
        expected_version: int | None = None,
        reason: str | None = None,
    ) -> tuple[Experiment, int]:
        """Check ``spec`` against what this gateway serves, write it to the store, then route by it.

        Returns:
            The installed experiment and its new version.

        The answer is true: the change either committed, or raised and changed nothing; the one exception
        is :class:`OutcomeUnknown`, which says that it cannot tell.

        Raises:
            ValueError: the name or spec is invalid, or names nothing served here (nothing written).
            registry.experiments.StaleVersion: ``expected_version`` is not the store's (nothing written).
            StoreUnavailable: the registry cannot be reached, or its write lock was not free within
                :attr:`write_deadline_s` (rolled back: nothing written).
            OutcomeUnknown: the registry never answered the COMMIT.
        """
        parse_spec(name, spec)
        experiment = self.router.compile_experiment(name, spec)  # raises before anything is written
        record = await self._write(
            self._opened_store().set,
            name,
            spec_json(spec),
            actor=actor,
            expected_version=expected_version,
            reason=reason,
        )
        self._installed(name, record)
        return experiment, record.version

    async def delete(self, name: str, *, actor: str, expected_version: int | None = None) -> int:
        """Delete ``name`` in the store, then stop routing it here.

        Returns:
            The version of the deletion.

        Raises:
            registry.experiments.ExperimentNotFound, StaleVersion, StoreUnavailable: nothing changed.
            OutcomeUnknown: as for :meth:`put`.
        """
        store = self._opened_store()
        record = await self._write(store.delete, name, actor=actor, expected_version=expected_version)
        self._installed(name, record)
        return record.version

    async def history(self, name: str) -> list:
        """Every change of ``name`` in the store, oldest first."""
        return await self._call(self._opened_store().history, name, timeout_s=self.read_timeout_s)

    def status(self) -> dict[str, Any]:
        """What ``/ready`` says about the experiments."""
        shared = self.registry_url is not None
        status: dict[str, Any] = {
            "store": "registry" if shared else "memory",
            "in_sync": self.error is None and self.synced,
            "synced": self.synced,
            "versions": {name: self.versions.get(name) for name in self.router.experiments},
        }
        if shared:
            status["last_sync_age_s"] = round(self._sync_age(), 3)
        if self.error is not None:
            status["error"] = self.error
        if self.not_served:
            status["not_served"] = dict(self.not_served)
        return status


def _unreachable(error: DBAPIError) -> str:
    reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
    return f"the registry cannot be reached: {reason}"


def gateway_actor(host: str, port: int) -> str:
    """How a gateway signs the changes it makes: ``gateway HOSTNAME (HOST:PORT)``."""
    return f"gateway {socket.gethostname()} ({host}:{port})"
