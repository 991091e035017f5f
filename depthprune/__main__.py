"""``python -m depthprune`` is the console script."""

from depthprune.cli.app import main

main()
