"""Ports and processes for tests and benchmarks: a free port, start a server, wait until it answers, stop it.

Every test or benchmark that runs a gateway, a vLLM server or a fake one goes through these, so a server
that dies while starting fails with the tail of its log instead of a timeout, and nothing is left running::

    with running(vllm_command(model_dir, ["dense"], port), f"http://127.0.0.1:{port}", log) as process:
        ...
    with running_gateway(f"dense={url}", tmp_path / "gateway.log") as gateway:
        httpx.get(f"{gateway.url}/v1/models")
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from ground.core.processes import stop_process_group
from server.backends import free_port

__all__ = [
    "Gateway",
    "free_port",
    "gateway_command",
    "read_json_line",
    "running",
    "running_gateway",
    "start_logged",
    "stop",
    "vllm_command",
    "wait_until",
    "wait_until_up",
]

T = TypeVar("T")


def start_logged(
    command: list[str], log: Path, env: dict | None = None, *, stdout_pipe: bool = False, **popen
) -> subprocess.Popen:
    """Start ``command`` in its own process group with its output going to ``log``.

    Args:
        command: the command line.
        log: file that receives stderr, and stdout too unless ``stdout_pipe``.
        env: variables added to this process' environment.
        stdout_pipe: give stdout to the caller as a pipe (``process.stdout``, read by
            :func:`read_json_line`) instead of the log.
        **popen: further ``subprocess.Popen`` arguments (``cwd``, ...).

    Returns:
        The started process; :func:`stop` stops it and everything it started.
    """
    with open(log, "w") as handle:
        return subprocess.Popen(
            command,
            stdout=subprocess.PIPE if stdout_pipe else handle,
            stderr=handle if stdout_pipe else subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            **popen,
        )


def wait_until(
    condition: Callable[[], T], timeout_s: float = 30, what: str = "the condition", interval_s: float = 0.1
) -> T:
    """Call ``condition`` until it returns something true, and return that.

    Raises:
        TimeoutError: ``timeout_s`` passed first; the message names ``what`` was waited for.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def wait_until_up(
    url: str,
    process: subprocess.Popen | None = None,
    log: Path | None = None,
    timeout_s: float = 900,
    headers: dict | None = None,
) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        RuntimeError: the process exited first, or ``timeout_s`` passed; the message ends with the log's tail.
    """

    def answered() -> bool:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=3, headers=headers).status_code == 200
        return False

    try:
        wait_until(answered, timeout_s, url, interval_s=0.5)
    except TimeoutError:
        raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s{_tail(log)}") from None


def read_json_line(process: subprocess.Popen, log: Path | None = None, timeout_s: float = 120) -> dict:
    """The first line that ``process`` prints on its stdout pipe that is a JSON object.

    Raises:
        RuntimeError: the process exited or closed stdout first, or ``timeout_s`` passed; the message ends
            with the log's tail.
    """
    # Raw reads, not readline: a line buffered in a file object would be invisible to select.
    descriptor, pending = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([descriptor], [], [], 0.5)
        chunk = os.read(descriptor, 65536) if ready else None
        if chunk == b"":  # end of file: the process is gone or going
            process.wait(timeout=30)
        pending += chunk or b""
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.startswith(b"{"):
                return json.loads(line)
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before it printed JSON{_tail(log)}")
    raise RuntimeError(f"no JSON line within {timeout_s:.0f} s{_tail(log)}")


def stop(process: subprocess.Popen, timeout_s: float = 60, first_signal: int = signal.SIGTERM) -> int:
    """Stop the process group that :func:`start_logged` made (the kit's defaults for
    :func:`~ground.core.processes.stop_process_group`).

    ``first_signal`` goes to the whole group; whatever is still alive after ``timeout_s``, or after the
    leader exits (an orphaned engine worker), gets SIGKILL.

    Returns:
        The leader's exit code (negative: the signal that ended it).
    """
    return stop_process_group(process, first_signal, grace_s=timeout_s, reap_timeout_s=30)


@contextlib.contextmanager
def running(
    command: list[str],
    url: str,
    log: Path,
    *,
    health: str = "/health",
    env: dict | None = None,
    timeout_s: float = 900,
    stop_signal: int = signal.SIGTERM,
) -> Iterator[subprocess.Popen]:
    """Run a server until the block ends: :func:`start_logged`, wait until ``url + health`` answers, stop.

    Yields:
        The server's process.
    """
    process = start_logged(command, log, env)
    try:
        wait_until_up(url + health, process, log, timeout_s)
        yield process
    finally:
        stop(process, first_signal=stop_signal)


def vllm_command(
    model_dir: Path | str,
    served_names: list[str],
    port: int,
    *,
    dtype: str = "float32",
    max_model_len: int = 256,
    extra_args: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The command line of vLLM's OpenAI server for ``model_dir`` under ``served_names`` on loopback."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        *served_names,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        *extra_args,
    ]


def gateway_command(variants: str, port: int, *options: str) -> list[str]:
    """The command line of ``depthprune serve --variants VARIANTS --port PORT OPTIONS...``."""
    return [
        sys.executable,
        "-m",
        "depthprune",
        "serve",
        "--variants",
        variants,
        "--port",
        str(port),
        *options,
    ]


@dataclass
class Gateway:
    """A ``depthprune serve`` process started by :func:`running_gateway`."""

    url: str
    """Its base URL, ``http://127.0.0.1:PORT``."""
    summary: dict
    """The JSON line ``serve --json`` printed once every backend was up (url, variants, experiments)."""
    process: subprocess.Popen
    """The process; ``process.returncode`` is its exit code once the block has ended."""
    log: Path
    """Its stderr."""


@contextlib.contextmanager
def running_gateway(
    variants: str,
    log: Path,
    *options: str,
    port: int | None = None,
    env: dict | None = None,
    timeout_s: float = 120,
    stop_timeout_s: float = 60,
) -> Iterator[Gateway]:
    """Run ``depthprune serve --variants VARIANTS --json OPTIONS...`` until the block ends.

    Waits for its JSON summary line and for ``/ready``; at the end it is stopped as Ctrl-C would (SIGINT
    to its process group), so that serve stops its vLLM engines itself.

    Args:
        variants: the ``--variants`` value (names, or ``name=URL``).
        log: file that receives its stderr.
        *options: further ``serve`` options.
        port: port to listen on; a free one when None.
        env: variables added to the environment (e.g. ``DEPTHPRUNE_HOME``).
        timeout_s: how long to wait for the summary line, and again for ``/ready``.
        stop_timeout_s: how long it may take to stop before it is killed.

    Yields:
        The running :class:`Gateway`.
    """
    port = port or free_port()
    command = gateway_command(variants, port, "--json", *options)
    process = start_logged(command, log, env, stdout_pipe=True)
    try:
        summary = read_json_line(process, log, timeout_s)
        wait_until_up(f"{summary['url']}/ready", process, log, timeout_s)
        yield Gateway(summary["url"], summary, process, log)
    finally:
        stop(process, stop_timeout_s, first_signal=signal.SIGINT)
        process.stdout.close()


def _tail(log: Path | None) -> str:
    if log is None or not Path(log).is_file():
        return ""
    return f":\n{Path(log).read_text(errors='replace')[-3000:]}"
