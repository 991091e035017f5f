"""A small stand-in for a vLLM OpenAI server, for the gateway tests that need no real engine.

It speaks the same HTTP API (``/health``, ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``
with streaming and ``stream_options.include_usage``, ``/metrics``) with deterministic answers that name
the serving model, so a test can see which backend answered. Runs in a thread (:func:`serve_in_thread`)
or as a process with vLLM's command line
(``python -m depthprune.testing.fake_vllm --model DIR --served-model-name
NAME --port P``), which is how the gateway's process management is tested without the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time

if __name__ == "__main__" and "--hang-start" in sys.argv:
    # Start-timeout test: a server that never listens. Checked before the slow imports so that the
    # message is in the log even on a loaded machine.
    print("loading weights forever", flush=True)
    time.sleep(3600)

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

from depthprune.testing import fake_tokens  # noqa: E402

MAX_MODEL_LEN = 128
# vLLM reads its request fields with pydantic's lax rules (1.0 is the integer 1); so does the fake.
TOKEN_COUNT = TypeAdapter(int)


def create_fake_app(served_model: str, max_model_len: int = MAX_MODEL_LEN) -> FastAPI:
    """An app answering like vLLM for ``served_model``; ``app.state.requests`` counts generations."""
    app = FastAPI()
    app.state.requests = 0
    app.state.hang_health = False

    @app.get("/health")
    async def health():
        while app.state.hang_health:  # "stops answering" until the test lets it go
            await asyncio.sleep(0.05)
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": served_model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "vllm",
                    "root": "/fake",
                    "max_model_len": max_model_len,
                }
            ],
        }

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            f'vllm:num_requests_running{{model_name="{served_model}"}} 0.0\n'
            f'vllm:generation_tokens_total{{model_name="{served_model}"}} '
            f"{app.state.requests}.0\n"
        )

    async def generate(request: Request, chat: bool):
        body = await request.json()
        app.state.requests += 1
        return answer(body, chat, served_model, max_model_len)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return app


def answer(body: dict, chat: bool, served_model: str, max_model_len: int):
    """vLLM's answer to a (chat) completion request: ``max_tokens`` words naming the model, or its error."""
    if body.get("model") != served_model:
        message = f"The model `{body.get('model')}` does not exist."
        return _error_response(message, "NotFoundError", "model", 404)
    if chat:
        prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        prompt = body["prompt"] if isinstance(body["prompt"], str) else json.dumps(body["prompt"])
    prompt_tokens = len(prompt.split())
    max_tokens = TOKEN_COUNT.validate_python(body.get("max_tokens") or body.get("max_completion_tokens") or 4)
    if prompt_tokens + max_tokens > max_model_len:
        message = f"This model's maximum context length is {max_model_len} tokens."
        return _error_response(message, "BadRequestError", None, 400)
    words = [f"{served_model}-t{i}" for i in range(max_tokens)]
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }
    kind = "chat.completion" if chat else "text_completion"
    ids = _token_ids(body, chat, served_model, max_tokens)
    if not body.get("stream"):
        text = " ".join(words)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        # vLLM writes the id fields (null unless return_token_ids) and prompt_logprobs when asked
        choice["token_ids"] = ids["generated"]
        if not chat:
            choice["prompt_token_ids"] = ids["prompt"]
        if body.get("prompt_logprobs") and not chat:
            choice["prompt_logprobs"] = fake_tokens.prompt_logprobs(
                served_model, fake_tokens.prompt_ids(body["prompt"])
            )
        top = {"prompt_token_ids": ids["prompt"]} if chat else {}
        return {
            "id": "cmpl-fake",
            "object": kind,
            "created": 0,
            "model": served_model,
            "choices": [choice],
            "usage": usage,
            **top,
        }
    events = stream_events(body, chat, served_model, words, usage, ids)
    return StreamingResponse(events, media_type="text/event-stream")


def _token_ids(body: dict, chat: bool, served_model: str, max_tokens: int) -> dict:
    """The prompt's and the answer's ids when ``return_token_ids`` asks for them, else None (as vLLM)."""
    if body.get("return_token_ids") is not True:
        return {"prompt": None, "generated": None}
    prompt = body["messages"] if chat else body["prompt"]
    return {
        "prompt": fake_tokens.prompt_ids(prompt if not chat else json.dumps(prompt)),
        "generated": fake_tokens.generated_ids(served_model, prompt, max_tokens),
    }


async def stream_events(
    body: dict, chat: bool, served_model: str, words: list[str], usage: dict, ids: dict | None = None
):
    """The server-sent events of a streamed answer: one chunk per word, the usage if asked, ``[DONE]``."""
    kind = "chat.completion" if chat else "text_completion"
    ids = ids or {"prompt": None, "generated": None}
    for i, word in enumerate(words):
        finish = "length" if i == len(words) - 1 else None
        choice = (
            {"index": 0, "delta": {"content": " " + word}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": " " + word, "finish_reason": finish}
        )
        choice["token_ids"] = None if ids["generated"] is None else ids["generated"][i : i + 1]
        if not chat:
            choice["prompt_token_ids"] = ids["prompt"] if i == 0 else None
        chunk = {
            "id": "cmpl-fake",
            "object": kind + (".chunk" if chat else ""),
            "created": 0,
            "model": served_model,
            "choices": [choice],
        }
        if chat and i == 0:
            chunk["prompt_token_ids"] = ids["prompt"]
        yield f"data: {json.dumps(chunk)}\n\n"
        await asyncio.sleep(body.get("fake_delay", 0.001))
    if (body.get("stream_options") or {}).get("include_usage"):
        last = {
            "id": "cmpl-fake",
            "object": kind,
            "created": 0,
            "model": served_model,
            "choices": [],
            "usage": usage,
        }
        yield f"data: {json.dumps(last)}\n\n"
    yield "data: [DONE]\n\n"
    await asyncio.sleep(body.get("fake_linger", 0))  # an engine slow to end the response after [DONE]


def _error_response(message: str, error_type: str, param: str | None, code: int) -> JSONResponse:
    """An error in vLLM's shape, with ``code`` as the HTTP status too."""
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}, code
    )


class ThreadServer:
    """A uvicorn server on loopback in a daemon thread; ``stop()`` shuts it down."""

    def __init__(self, app, port: int):
        import uvicorn

        self.app, self.port = app, port
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout: float = 30) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} failed to start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve_in_thread(app, port: int) -> ThreadServer:
    """Start ``app`` on ``127.0.0.1:port`` in a thread and wait until it listens."""
    return ThreadServer(app, port).start()


def main(argv: list[str] | None = None) -> None:
    """vLLM-like command line: ``--model --served-model-name --host --port`` (other flags ignored)."""
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--fail-start", action="store_true", help="print an error and exit 1 (start-failure test)"
    )
    args, _ = parser.parse_known_args(argv)
    if args.fail_start:
        print("RuntimeError: fake engine failed to allocate the KV cache", flush=True)
        sys.exit(1)
    uvicorn.run(create_fake_app(args.served_model_name), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
