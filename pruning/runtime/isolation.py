"""One GPU job per process: run a function in a fresh spawned process, and tell an out-of-memory apart.

A vLLM engine cannot be freed reliably inside a process, and torch's caching allocator keeps the memory of a
finished pruning run reserved, so an evaluation engine started in the same process profiles a card that
looks full. :func:`run_in_own_process` runs a job in a process of its own (spawned, so it inherits no CUDA
state) and hands back its result or its exception; when the job ends, every byte it held is the OS's again.
An out-of-memory error is a permanent failure (:class:`OutOfMemory`): trying the same cell again on the same
card fails the same way, so the study's work queue does not retry it.
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
from collections.abc import Callable
from typing import Any

from ground.core.errors import UserError
from registry.work_queue import PERMANENT_PREFIX


class OutOfMemory(UserError):
    """A job ran out of device or host memory: permanent on that machine; the message says what to do."""


def is_out_of_memory(error: BaseException) -> bool:
    """True for torch's ``OutOfMemoryError``, a ``MemoryError`` or a CUDA/vLLM "out of memory" message."""
    if isinstance(error, MemoryError | OutOfMemory) or type(error).__name__ == "OutOfMemoryError":
        return True
    return "out of memory" in str(error).lower()


def out_of_memory_message(error: BaseException) -> str:
    """The one line a failed cell records for an out-of-memory error, with what to do about it."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"{PERMANENT_PREFIX}out of memory ({first[:200]}); run the command with --dry-run for the memory "
        "plan and its advice (more --gpus, a larger card, fewer --samples or a shorter --seq-len)"
    )


def release_device_memory() -> None:
    """Collect garbage and give torch's cached CUDA memory back to the driver (for the next process)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _child(connection, function: Callable, args: tuple, kwargs: dict) -> None:
    try:
        result = ("ok", function(*args, **kwargs))
    except BaseException as error:  # noqa: BLE001 - handed to the parent, which raises it
        if is_out_of_memory(error):
            error = OutOfMemory(out_of_memory_message(error))
        result = ("error", error)
    try:
        connection.send(result)
    except Exception as error:  # noqa: BLE001 - an unpicklable result or exception: say what it was
        connection.send(("error", RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({error})")))
    connection.close()


def run_in_own_process(function: Callable[..., Any], *args, **kwargs) -> Any:
    """``function(*args, **kwargs)`` in a spawned process; its result, or its exception raised here.

    ``function``, its arguments and its result must pickle (a module-level function, plain data).

    Raises:
        OutOfMemory: the job ran out of memory (also when the OS killed it for that).
        RuntimeError: the process died without an answer.
    """
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, function, args, kwargs), daemon=False)
    process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        process.join()
        if process.exitcode == -9:  # SIGKILL: the kernel's out-of-memory killer, most likely
            raise OutOfMemory(
                out_of_memory_message(MemoryError("the process was killed (SIGKILL)"))
            ) from None
        raise RuntimeError(f"{function.__name__} died with exit code {process.exitcode}") from None
    finally:
        receiver.close()
    process.join()
    if status == "error":
        raise payload
    return payload
