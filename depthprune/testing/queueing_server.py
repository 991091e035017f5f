"""A stand-in for vLLM whose latency grows with load: each served model is an engine of a few slots.

For the capacity search's tests (``loadtest --slo``): a request waits for a free slot of its model's engine
(time to first token grows with the queue), then streams its tokens one every ``token_s`` seconds. A model
with a smaller ``token_s`` (a pruned variant) serves more requests per second within the same objective.
It speaks the streaming completions API the load test uses (and ``/v1/models``); run it with
:func:`depthprune.testing.fake_vllm.serve_in_thread`::

    server = serve_in_thread(create_queueing_app({"dense": 0.004, "v": 0.003}), free_port())
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from depthprune.testing.fake_vllm import stream_events


def create_queueing_app(token_s: dict[str, float], slots: int = 2, prefill_s: float = 0.002) -> FastAPI:
    """An app serving each model of ``token_s`` (name -> seconds per token) on a ``slots``-slot engine."""
    app = FastAPI()
    engines = {name: asyncio.Semaphore(slots) for name in token_s}

    @app.get("/v1/models")
    async def models():
        cards = [{"id": name, "object": "model", "owned_by": "vllm", "root": "/fake"} for name in token_s]
        return {"object": "list", "data": cards}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        model = body.get("model")
        if model not in token_s:
            return JSONResponse({"error": {"message": f"no model {model}", "code": 404}}, 404)
        max_tokens = int(body.get("max_tokens") or 4)
        words = [f"{model}-t{i}" for i in range(max_tokens)]
        usage = {"prompt_tokens": len(str(body.get("prompt", "")).split()), "completion_tokens": max_tokens}

        async def events():
            async with engines[model]:
                await asyncio.sleep(prefill_s)
                paced = {**body, "fake_delay": token_s[model]}
                async for event in stream_events(paced, False, model, words, usage):
                    yield event

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
