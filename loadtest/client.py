"""A streaming client of the OpenAI completions API that times every token.

One request = one ``POST {target}/v1/completions`` with ``stream: true`` and
``stream_options.include_usage``; ``ignore_eos`` and ``min_tokens`` (vLLM extra body fields) make every
model generate exactly ``max_tokens`` tokens, so dense and pruned variants do the same work. The
timings follow ``vllm bench serve``: TTFT is the time to the first chunk carrying a choice, ITL the gap
between later chunks, latency the time to the last chunk with a choice.

The stream is read with aiohttp, the client ``vllm bench serve`` uses: on a small machine the load client
shares the CPU with the server it measures, so its cost per streamed chunk should be no larger than that of
the benchmark it is compared with (docs/benchmarks.md, "Load test", has both clients measured).

Only the URL the user gave is contacted; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp
import httpx

from ground.core.errors import UserError

CONNECT_TIMEOUT_S = 10.0
"""Seconds to open a TCP connection: a server that does not accept by then is down, not busy."""


@dataclass
class RequestResult:
    """What one streamed request measured (times in seconds, from ``time.perf_counter``)."""

    success: bool = False
    """True when at least one token arrived and the stream ended cleanly."""
    error_kind: str | None = None
    """Short class of failure: ``http_503``, ``timeout``, ``connection``, ``protocol``, ``no_tokens``,
    ``stream_error`` (an error event inside a 200 stream)."""
    error: str = ""
    """The server's message or the exception text, for the report."""
    prompt_len: int = 0
    """Prompt tokens as the server counted them (``usage.prompt_tokens``), else the client's estimate."""
    output_tokens: int = 0
    """Generated tokens (``usage.completion_tokens``), else the number of chunks with a choice."""
    ttft: float = 0.0
    """Seconds from sending the request to the first chunk with a choice."""
    itl: list[float] = field(default_factory=list)
    """Gaps in seconds between successive chunks with a choice."""
    latency: float = 0.0
    """Seconds from sending to the last chunk with a choice (end-to-end latency)."""
    start_time: float = 0.0
    """``time.perf_counter()`` when the request was sent."""
    queue_time: float = 0.0
    """Seconds the request waited on the client's concurrency cap after its arrival time."""
    generated_text: str = ""
    """The generated text (kept for debugging; not written to result files)."""


def completion_payload(model: str, prompt: str, max_tokens: int, *, ignore_eos: bool = True) -> dict:
    """The request body of one benchmark completion (greedy, fixed length when ``ignore_eos``)."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
        payload["min_tokens"] = max_tokens
    return payload


async def stream_completion(
    client: aiohttp.ClientSession,
    target: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    prompt_len_estimate: int = 0,
    ignore_eos: bool = True,
    timeout_s: float = 300.0,
) -> RequestResult:
    """Send one streaming completion and time its tokens; never raises for server or network failures.

    Args:
        client: A shared ``aiohttp.ClientSession`` (see ``loadtest.runner.make_client``).
        target: Base URL of the server (``http://127.0.0.1:8000``).
        model: The ``model`` field (served name or alias).
        prompt: Prompt text.
        max_tokens: Tokens to generate.
        prompt_len_estimate: Prompt length to report when the server sends no usage.
        ignore_eos: Ask the server to generate exactly ``max_tokens`` tokens.
        timeout_s: Whole-request time limit, from sending to the end of the stream.

    Returns:
        The measured :class:`RequestResult`; ``success`` is False with ``error_kind`` set on failure.
    """
    result = RequestResult(prompt_len=prompt_len_estimate)
    url = target.rstrip("/") + "/v1/completions"
    payload = completion_payload(model, prompt, max_tokens, ignore_eos=ignore_eos)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(CONNECT_TIMEOUT_S, timeout_s))
    result.start_time = time.perf_counter()
    try:
        async with client.post(url, json=payload, timeout=timeout, allow_redirects=False) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                result.error_kind = f"http_{response.status}"
                result.error = _error_message(body)
                return result
            stream = await _read_stream(response, result)
    # aiohttp's ServerTimeoutError is both an asyncio.TimeoutError and a ClientError: catch it here first.
    except asyncio.TimeoutError as error:
        result.error_kind, result.error = (
            "timeout",
            f"no answer within {timeout_s:g} s ({type(error).__name__})",
        )
        return result
    # Refused or dropped connections, a stream cut short (ClientPayloadError), a malformed HTTP answer.
    except aiohttp.ClientError as error:
        result.error_kind, result.error = "connection", f"{type(error).__name__}: {error}"
        return result
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
        result.error_kind, result.error = "protocol", f"malformed stream: {error}"
        return result
    if stream is None:  # an error event inside the stream, already recorded
        return result
    result.generated_text = "".join(stream.text_parts)
    if stream.chunks_with_choice == 0:
        result.error_kind, result.error = "no_tokens", "the stream ended without a token"
        return result
    result.latency = stream.last_choice_time - result.start_time
    usage_tokens = stream.usage_tokens
    result.output_tokens = int(usage_tokens) if usage_tokens is not None else stream.chunks_with_choice
    result.success = True
    return result


@dataclass
class _StreamTally:
    """What a completed stream left to count once it ended (its per-token times are already in the result)."""

    chunks_with_choice: int
    """Chunks that carried a choice (a token)."""
    usage_tokens: int | None
    """``usage.completion_tokens`` of the last usage chunk, if any."""
    text_parts: list[str]
    """The text of each chunk with a choice."""
    last_choice_time: float
    """``time.perf_counter()`` when the last chunk with a choice arrived (the start time without any)."""


async def _read_stream(response: aiohttp.ClientResponse, result: RequestResult) -> _StreamTally | None:
    """Read the server-sent events of a 200 answer, timing each chunk with a choice into ``result``.

    Returns:
        The tally of the stream, or None after an error event (recorded in ``result`` as ``stream_error``).
    """
    start = last = result.start_time
    chunks_with_choice = 0
    usage_tokens: int | None = None
    text_parts: list[str] = []
    # Lines stay bytes: only event data is parsed, and the whole stream is never decoded to text.
    async for line in response.content:
        line = line.strip()
        # SSE comments (pings) start with ':'; blank lines separate events.
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            result.error_kind = "stream_error"
            result.error = _error_message(data.decode(errors="replace"))
            return None
        if chunk.get("choices"):
            now = time.perf_counter()
            if chunks_with_choice == 0:
                result.ttft = now - start
            else:
                result.itl.append(now - last)
            last = now
            chunks_with_choice += 1
            text_parts.append(chunk["choices"][0].get("text") or "")
        if chunk.get("usage"):
            usage = chunk["usage"]
            usage_tokens = usage.get("completion_tokens")
            if usage.get("prompt_tokens") is not None:
                result.prompt_len = int(usage["prompt_tokens"])
    return _StreamTally(chunks_with_choice, usage_tokens, text_parts, last)


def _error_message(body: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body itself (shortened)."""
    try:
        parsed = json.loads(body)
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)[:500]
        return str(error)[:500]
    except (json.JSONDecodeError, AttributeError):
        return body[:500]


def served_models(target: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> dict[str, dict]:
    """``id -> entry`` of ``GET {target}/v1/models``; an unreachable or non-OpenAI target is a UserError."""
    url = target.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise UserError(f"cannot reach {target} ({type(error).__name__}); is the server running?") from None
    if response.status_code in (401, 403):
        raise UserError(f"{url} refused the request (HTTP {response.status_code}); pass --api-key")
    if response.status_code != 200:
        raise UserError(
            f"{url} answered HTTP {response.status_code}; is {target} an OpenAI-compatible server?"
        )
    try:
        entries = response.json()["data"]
        return {str(entry["id"]): entry for entry in entries}
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{url} did not return an OpenAI model list") from None
