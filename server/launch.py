"""Run the gateway in the foreground as ``depthprune serve`` does: bind, start backends, serve until Ctrl-C.

The order is the point: the port is bound first (a taken port is an error in a second, not after the engines
loaded for minutes), the experiments are checked before any process starts, the backends are started and
waited for, and only then does the gateway accept requests; every process it started is stopped when it
stops. While it runs, a lease under ``DEPTHPRUNE_HOME/serving`` (:mod:`registry.serving`) says which
variants it serves. ``server.cli`` builds the :class:`~server.settings.GatewaySettings` and calls
:func:`serve_gateway`::

    serve_gateway(settings, log_level="info", on_ready=lambda pool: print(gateway_summary(settings, pool)))
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from ground.core.errors import UserError
from registry.serving import remove_lease, write_lease
from server.app import create_app
from server.backends import BackendPool
from server.settings import GatewaySettings

__all__ = ["gateway_summary", "listen_socket", "serve_gateway"]


def serve_gateway(
    settings: GatewaySettings,
    *,
    log_level: str = "info",
    show_progress: bool = True,
    on_ready: Callable[[BackendPool], None] | None = None,
    check_before_start: Callable[[str], None] | None = None,
) -> None:
    """Start every backend of ``settings``, then serve the gateway until it is stopped (Ctrl-C, SIGTERM).

    Args:
        settings: backends, experiments, address and limits of the gateway.
        log_level: gateway log level (debug, info, warning).
        show_progress: show a progress bar on stderr while the backends start.
        on_ready: called with the started backends just before the gateway serves (to say where it serves).
        check_before_start: run before every start and restart of a managed backend, with its name; a
            UserError refuses it (see :class:`server.backends.BackendPool`).

    Raises:
        UserError: the port cannot be bound, or an experiment is malformed (before any process starts).
        BackendStartError: a managed backend did not come up (every process started is stopped first).
        KeyboardInterrupt: a signal (Ctrl-C, SIGTERM) stopped it, once every process it started is stopped,
            so that the command exits as an interrupted one (130) rather than as a success.
    """
    sock = listen_socket(settings.host, settings.port)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pool = BackendPool(settings, check_before_start=check_before_start)
    app = create_app(settings, pool)  # checks the experiments before any process starts
    lease = write_lease(served_variants(settings), url=f"http://{settings.host}:{settings.port}")
    try:
        start_backends(pool, show_progress)
        if on_ready is not None:
            on_ready(pool)

        server = signal_recording_server(app, log_level)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            server.stopped_by = server.stopped_by or signal.SIGINT  # uvicorn re-raised what it handled
        finally:
            sock.close()
            pool.stop_processes()
        if server.stopped_by is not None:
            # Stopped by a signal, so the command ends as an interrupted one (130; SIGTERM 143 through the
            # console script's handler), also where SIGINT came ignored and uvicorn's re-raise did nothing.
            raise KeyboardInterrupt
    finally:
        remove_lease(lease)  # also when a backend failed to start: this gateway serves nothing any more


def signal_recording_server(app, log_level: str):
    """A ``uvicorn.Server`` for ``app`` that records, as ``stopped_by``, the first signal that stopped it."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        def handle_exit(self, sig, frame) -> None:
            self.stopped_by = self.stopped_by or sig
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level=log_level.lower(), access_log=False, timeout_graceful_shutdown=10)
    return Server(config)


def served_variants(settings: GatewaySettings) -> list[dict]:
    """What the gateway's lease (:mod:`registry.serving`) says it serves: each managed backend's variant
    and checkpoint directory (a speculative arm's draft too), so that ``variants rm --delete-checkpoint`` can
    refuse to pull it away."""
    served = []
    for spec in settings.backends:
        if not spec.managed:
            continue
        served.append(
            {
                "name": spec.name,
                "variant_id": spec.metadata.variant_id,
                "checkpoint_path": local_path(spec.model_dir),
            }
        )
        if spec.speculative is not None:  # a draft in use is served too: its checkpoint must stay
            draft = spec.speculative
            served.append(
                {
                    "name": f"{spec.name}.draft",
                    "variant_id": draft.draft_variant_id,
                    "checkpoint_path": local_path(draft.model_dir),
                }
            )
    return served


def local_path(model_dir: str) -> str:
    """A local directory as an absolute path (``variants rm`` may run elsewhere); a hub id as it is."""
    path = Path(model_dir).expanduser()
    return str(path.absolute()) if path.exists() else model_dir


def listen_socket(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound now: a taken port is a UserError before engines start for
    minutes, and clients that connect once ``serve`` says it is ready are queued, never refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {error.strerror}; pick another --port") from None
    return sock


def start_backends(pool: BackendPool, show_progress: bool) -> None:
    """Start the backends one after another, with a transient progress bar naming the one starting."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
        disable=not show_progress,
    ) as progress:
        task = progress.add_task("starting backends", total=len(pool.backends))
        started: list[str] = []

        def on_start(name: str) -> None:
            if started:
                progress.advance(task)
            started.append(name)
            kind = "vLLM" if pool[name].managed else "remote"
            progress.update(task, description=f"starting {kind} backend {name!r}")

        asyncio.run(pool.start_backends(on_start))
        progress.advance(task)


def gateway_summary(settings: GatewaySettings, pool: BackendPool) -> dict:
    """``{url, variants: {name: status}, experiments: [names]}`` of a started gateway."""
    return {
        "url": f"http://{settings.host}:{settings.port}",
        "variants": {name: variant.status() for name, variant in pool.variants.items()},
        "experiments": list(settings.experiments),
    }
