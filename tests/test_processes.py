"""The one process-group stopper (ground/core/processes.py): nothing of a group outlives its stop."""

from __future__ import annotations

import signal
import subprocess
import time

from depthprune.testing.servers import wait_until
from ground.core.processes import stop_process_group
from server.supervisor import group_members


def test_a_group_whose_leader_already_exited_is_killed_too():
    """An engine worker orphaned by a dead server is not left running."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & exit 0"], start_new_session=True)
    leader.wait(timeout=10)
    assert group_members(leader.pid), "the orphaned sleep is running"
    assert stop_process_group(leader, signal.SIGTERM, grace_s=1) == 0
    wait_until(lambda: group_members(leader.pid) == [], 10, "the orphan gone")


def test_a_group_that_ignores_the_first_signal_is_killed_after_the_grace():
    leader = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"], start_new_session=True)
    time.sleep(0.3)
    started = time.monotonic()
    assert stop_process_group(leader, signal.SIGTERM, grace_s=1, reap_timeout_s=10) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    wait_until(lambda: group_members(leader.pid) == [], 10, "the group gone")
