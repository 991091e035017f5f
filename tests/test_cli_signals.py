"""SIGTERM to the console script unwinds the command like Ctrl-C: its ``finally`` blocks stop what it started.

Python's default for SIGTERM ends the process on the spot; that left ``depthprune demo``'s gateway and
engines running and ``eval --engine vllm``'s engine worker orphaned (7.5 GB). The command here is a stand-in
run through the real ``main``: it starts a child and stops it in ``finally``, as the demo's gateway does.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from depthprune.testing.servers import wait_until
from server.supervisor import group_members

HOLDING_COMMAND = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    import typer
    import depthprune.cli.app as app

    # Python's Ctrl-C handler, as in a terminal: started from a background job (CI) SIGINT comes ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def build_app():
        cli = typer.Typer()

        @cli.command()
        def hold():
            child = subprocess.Popen(["sleep", "300"])
            try:
                print(child.pid, flush=True)
                time.sleep(300)
            finally:
                child.kill()
                child.wait()
                print("stopped the child", file=sys.stderr)

        @cli.command()
        def other():
            pass

        return cli

    app.build_app = build_app
    app.main(sys.argv[1:])
    """
)


def run_holding_command() -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDING_COMMAND, "hold"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return process, int(process.stdout.readline())


def test_sigterm_unwinds_the_command_and_exits_143():
    process, child = run_holding_command()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    stderr = process.stderr.read()
    assert "stopped the child" in stderr and stderr.rstrip().endswith("terminated")
    assert "Traceback" not in stderr
    wait_until(lambda: group_members(process.pid) == [], 10, "the command's child gone")


def test_ctrl_c_still_exits_130_without_saying_terminated():
    process, _ = run_holding_command()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    stderr = process.stderr.read()
    assert "stopped the child" in stderr and "terminated" not in stderr


def test_running_in_process_leaves_the_callers_sigterm_handler_alone(run_cli):
    before = signal.getsignal(signal.SIGTERM)
    assert run_cli("--help")[0] == 0
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(("signal_number", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_serve_once_serving_exits_as_an_interrupted_command(tmp_path, signal_number, code):
    """Issue 57, 6: SIGINT exited 130 during start-up but 0 once the gateway served (uvicorn handled it)."""
    from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
    from depthprune.testing.servers import free_port, running_gateway

    backend = serve_in_thread(create_fake_app("m"), free_port())
    try:
        home = {"DEPTHPRUNE_HOME": str(tmp_path / "home")}
        with running_gateway(f"m={backend.url}", tmp_path / "serve.log", env=home) as gateway:
            gateway.process.send_signal(signal_number)
            assert gateway.process.wait(timeout=60) == code, (tmp_path / "serve.log").read_text()[-2000:]
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        backend.stop()
