"""Ports and processes for tests and benchmarks: a free port, start a server, wait until it answers.

Every test or benchmark that runs a gateway, a vLLM server or a fake one goes through these, so a server
that dies while starting fails with the tail of its log instead of a timeout.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import httpx

from server.backends import free_port

__all__ = ["free_port", "start_logged", "wait_until_up", "stop"]


def start_logged(command: list[str], log: Path, env: dict | None = None, **popen) -> subprocess.Popen:
    """Start ``command`` in its own process group with stdout and stderr going to ``log``."""
    with open(log, "w") as handle:
        return subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            **popen,
        )


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=3, headers=headers).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s{_tail(log)}")


def stop(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM the process group ``start_logged`` made, then SIGKILL it if it lingers."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _tail(log: Path | None) -> str:
    if log is None or not Path(log).is_file():
        return ""
    return f":\n{Path(log).read_text(errors='replace')[-3000:]}"
