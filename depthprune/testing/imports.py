"""What importing something loads, seen from a fresh interpreter (this one has loaded everything already).

The gateway side (``registry``, ``server``, ``loadtest``) and the console script's ``--help`` must not pay
for torch or vLLM; tests check it with::

    assert heavy_modules_loaded("import server, server.cli") == []
"""

from __future__ import annotations

import json
import subprocess
import sys

__all__ = ["ENGINES", "heavy_modules_loaded"]

ENGINES = ("torch", "vllm", "transformers")
"""The modules that make an import slow."""


def heavy_modules_loaded(code: str, watched: tuple[str, ...] = ENGINES) -> list[str]:
    """Run ``code`` in a fresh Python and return which of ``watched`` it left in ``sys.modules``, sorted.

    Raises:
        RuntimeError: ``code`` failed; the message ends with its stderr.
    """
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))"
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if completed.returncode != 0:
        raise RuntimeError(f"the import probe failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])
