"""The supervisor of one managed backend: its server cannot outlive the gateway, nor its workers the server.

The gateway does not start ``python -m vllm.entrypoints.openai.api_server ...`` itself but this script,
which starts it and owns its process group (Linux)::

    python -I -S server/supervisor.py --parent GATEWAY_PID --grace 10 -- python -m vllm... --port 8001

- It asks the kernel for SIGTERM when the gateway dies (``prctl(PR_SET_PDEATHSIG)``), so a gateway killed
  with ``kill -9`` still takes its servers with it, and it checks that the gateway is still its parent once
  that is set (the gateway may have died in between).
- It is a child subreaper (``PR_SET_CHILD_SUBREAPER``): vLLM's ``EngineCore`` workers whose API server
  died are re-parented to it, not to init, and it reaps them.
- When the server exits (a crash, ``kill -9``) or a stop is asked (SIGTERM, SIGINT, SIGHUP, or the gateway's
  death), it sends SIGTERM to everything left in its process group, waits ``--grace`` seconds, SIGKILLs
  what remains, reaps it all and exits with the server's code. Nothing of the backend lingers.
- The server gets ``PR_SET_PDEATHSIG`` = SIGTERM too, for the case where the supervisor itself is killed.

It is run as a file with ``-I -S`` (standard library only), not as ``-m server.supervisor``, so that it does
not import the gateway's packages: it costs a few MB and a few tens of milliseconds per backend.
:meth:`server.backends.Backend.stop` stops the group from the gateway's side with
:func:`ground.core.processes.stop_process_group`, which also kills what is left of a group whose leader
is already dead.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXIT_PARENT_GONE = 75
"""Exit code when the gateway was already gone before the parent-death signal was armed."""


def set_process_option(option: int, value: int) -> None:
    """``prctl(option, value)`` on Linux; a no-op elsewhere (the gateway then relies on its own stop)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl({option}) failed: {os.strerror(error)}")


def group_members(group: int, *, exclude: int | None = None) -> list[int]:
    """Live processes (zombies excluded) whose process group is ``group``, read from ``/proc``.

    Args:
        group: the process group id.
        exclude: a pid to leave out (the caller itself).

    Returns:
        Their pids; empty where ``/proc`` does not exist.
    """
    members = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == exclude:
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue  # exited while we looked
            # The command name is in parentheses and may hold spaces: split after its closing one.
            fields = stat[stat.rfind(b")") + 2 :].split()
            if fields[0] != b"Z" and int(fields[2]) == group:
                members.append(int(entry))
    return members


def reap_children() -> None:
    """Collect every exited child (the server, and orphaned workers re-parented to this subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def signal_all(pids: list[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def empty_group(grace_s: float) -> None:
    """SIGTERM everything else in this process group, SIGKILL what is left after ``grace_s``, reap it all."""
    me = os.getpid()
    group = os.getpgid(0)
    signal_all(group_members(group, exclude=me), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := group_members(group, exclude=me)) and time.monotonic() < deadline:
        reap_children()
        time.sleep(0.05)
    signal_all(left, signal.SIGKILL)
    while group_members(group, exclude=me) and time.monotonic() < deadline + 5:
        reap_children()
        time.sleep(0.02)
    reap_children()


def arm_server_death_signal() -> None:
    """In the server, between fork and exec: SIGTERM when the supervisor dies (single-threaded here)."""
    set_process_option(PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(command: list[str], parent: int, grace_s: float) -> int:
    """Run ``command`` under supervision until it exits or a stop is asked; return the exit code to use."""
    set_process_option(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent and os.getppid() != parent:
        return EXIT_PARENT_GONE  # the gateway died before the death signal was armed
    set_process_option(PR_SET_CHILD_SUBREAPER, 1)
    stop_asked: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: stop_asked.append(received))
    server = subprocess.Popen(command, preexec_fn=arm_server_death_signal)
    while not stop_asked and server.poll() is None:
        time.sleep(0.1)
    if not stop_asked:
        print(f"supervisor: server exited with {server.returncode}; stopping its workers", flush=True)
    empty_group(grace_s)
    code = server.wait()
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> None:
    """``supervisor.py --parent PID --grace S -- COMMAND...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, default=0, help="pid of the gateway that must be the parent")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the server's command line, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server's command after --")
    sys.exit(supervise(command, args.parent, args.grace))


if __name__ == "__main__":
    main()
