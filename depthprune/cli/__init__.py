"""The shell: the ``depthprune`` console script and the end-to-end demo, which stand on every package.

* :mod:`~depthprune.cli.app` — the console script (:func:`main`), assembling each package's commands;
* :mod:`~depthprune.cli.demo` — ``depthprune demo``: prune, evaluate, serve, load-test, one table;
* :mod:`~depthprune.cli.demo_model` — ``depthprune demo-model``: build (or reuse) the demo model.

Nothing below the shell imports it (import-linter, ``pyproject.toml``).
"""

from depthprune.cli.app import COMMANDS, build_app, main

__all__ = ["COMMANDS", "build_app", "main"]
