"""Command-line functions of the pruning side: ``demo-model``, ``checkpoint``, ``prune``,
``bench-evaluator``, ``eval`` and ``study``.

Each function's typed signature is its command line (typer). Heavy modules (torch, transformers) are
imported inside the functions so that ``depthprune --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

