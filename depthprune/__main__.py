"""``python -m depthprune`` is the console script."""

from depthprune.cli import main

main()
