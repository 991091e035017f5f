"""Session fixtures around the embedded demo model, for any test that needs a real trained model and its data.

Import the fixture into a test module (or conftest.py)::

    import demo_fixtures

    demo_tiny_dir = demo_fixtures.demo_tiny_dir

``demo_tiny_dir`` builds :meth:`pruning.demo_model.DemoRecipe.tiny` once per session into the session's
``DEPTHPRUNE_HOME`` (seconds on 2 cores) and returns the model directory, with the held-out splits in
``data/*.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_tiny_dir(isolated_home) -> Path:
    """Directory of the tiny demo model (8 blocks, hidden 64), built once per test session."""
    from pruning.demo_model import DemoRecipe, ensure_demo_model

    return ensure_demo_model(DemoRecipe.tiny(), progress=False)
