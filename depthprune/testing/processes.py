"""Jobs for :func:`pruning.runtime.isolation.run_in_own_process` in tests (module-level: a spawned process
finds them)."""

from __future__ import annotations


def hold_memory(megabytes: int) -> int:
    """Allocate and touch ``megabytes`` MiB, and return how many bytes were held (then let them go)."""
    import numpy as np

    block = np.ones(megabytes * 1024 * 1024, dtype=np.uint8)
    return int(block.sum())


def fail_with(kind: str) -> None:
    """Raise ``MemoryError`` (``kind == "memory"``) or ``ValueError``."""
    if kind == "memory":
        raise MemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    raise ValueError("an ordinary failure")


def resident_bytes() -> int:
    """This process's resident set size now."""
    import psutil

    return psutil.Process().memory_info().rss
