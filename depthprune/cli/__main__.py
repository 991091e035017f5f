"""``python -m depthprune.cli`` is the console script."""

from depthprune.cli.app import main

main()
