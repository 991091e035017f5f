"""Run ``depthprune ARGS...`` in-process and capture what it printed, as a test sees a terminal."""

from __future__ import annotations

import contextlib
import io

__all__ = ["run_cli"]


def run_cli(*args: object) -> tuple[int, str, str]:
    """Run the console script with ``args`` (each turned into a string).

    Only this call's output is returned: stdout and stderr are redirected while it runs.

    Returns:
        ``(exit code, stdout, stderr)``; a user mistake is exit code 2 with one ``error:`` line on stderr.
    """
    from depthprune.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(arg) for arg in args])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return code, out.getvalue(), err.getvalue()
