"""Stopping a process group: the one way the gateway, the demo and the testing kit end what they started.

Every server depthprune starts (a vLLM engine, a gateway, a supervisor) leads its own process group
(``start_new_session=True``), because vLLM's engine workers outlive a server that is killed alone. Stopping
one means: a polite signal to the whole group, a grace period, SIGKILL for whatever is left, including
workers orphaned by a leader that had already died.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["kill_orphaned_group", "stop_process_group"]


def stop_process_group(
    process: subprocess.Popen,
    first_signal: int = signal.SIGTERM,
    *,
    grace_s: float = 30.0,
    reap_timeout_s: float | None = None,
) -> int:
    """Stop the process group that ``process`` leads; safe to call on a process that has already exited.

    While the leader lives, ``first_signal`` goes to the whole group (SIGINT lets ``depthprune serve`` stop
    its engines itself; SIGTERM suits a server); after ``grace_s`` the group gets SIGKILL. Once the leader is
    reaped, whatever is left of its group (an engine worker whose server died) is killed too.

    Args:
        process: a leader started with ``start_new_session=True``.
        first_signal: the signal that asks the group to stop.
        grace_s: seconds the group has to stop before SIGKILL.
        reap_timeout_s: how long to wait for the killed leader to be reaped (None: as long as it takes).

    Returns:
        The leader's exit code (negative: the signal that ended it).

    Raises:
        subprocess.TimeoutExpired: the leader was not reaped within ``reap_timeout_s`` after SIGKILL.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, first_signal)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            # The leader still holds its pid, so the group id is certainly still ours.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=reap_timeout_s)
    kill_orphaned_group(process.pid)
    return process.returncode


def kill_orphaned_group(group: int) -> None:
    """SIGKILL what is left of the process group of a leader that has exited and been reaped.

    The kernel does not hand out a pid that is still some living process's group id, so while members of the
    group live, no other process holds the number; a live process with that pid means the group is gone and
    the number belongs to someone else, and nothing is killed then.
    """
    try:
        os.kill(group, 0)
        return  # a live process holds the pid: not our group any more
    except PermissionError:
        return  # held by another user's process
    except ProcessLookupError:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
