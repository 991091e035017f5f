"""Forward one OpenAI request to the backend that serves it, streaming or not, and account for it.

The request body is parsed once (to route and to check it), the ``model`` field is rewritten to the
backend's served name, and the answer is relayed as the backend sends it: a non-streaming body as is, a
stream chunk by chunk with no re-framing (only the final usage event is looked at). Streams get
``stream_options.include_usage`` so the token counters are exact; the usage event is dropped again
when the client did not ask for it, so clients see exactly what vLLM would have sent them.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp
from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from server.backends import Backend, BackendPool
from server.errors import GatewayError, error_body, validation_problems
from server.experiments import Route, Router, RoutingError
from server.metrics import GatewayMetrics
from server.protocol import OpenAIRequest
from server.settings import GatewaySettings

VARIANT_HEADER = "x-depthprune-variant"
EXPERIMENT_HEADER = "x-depthprune-experiment"
ARM_HEADER = "x-depthprune-arm"
FALLBACK_HEADER = "x-depthprune-fallback-from"
PASSED_REQUEST_HEADERS = ("x-request-id", "traceparent")
# Failures of the backend connection: the request is answered 503 and the backend marked down.
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
CLIENT_CLOSED = "499"  # status label of a stream the client left (nginx's convention)


class RelayResponse(StreamingResponse):
    """A streaming response that always releases its upstream stream, even when the client leaves
    before the first chunk (then the relay generator never starts and its ``finally`` never runs)."""

    def __init__(self, content, finish, **kwargs):
        super().__init__(content, **kwargs)
        self._finish = finish

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._finish(CLIENT_CLOSED)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading them all.

    Raises:
        GatewayError: 413 for an oversize body, 400 when the client went away mid-body.
    """
    declared = request.headers.get("content-length")
    too_large = GatewayError(
        413, f"request body exceeds the limit of {limit} bytes", code="request_too_large"
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise GatewayError(
            400, "client disconnected while sending the body", code="client_disconnected"
        ) from None
    return b"".join(chunks)


def parse_request(raw: bytes, schema: type[OpenAIRequest]) -> tuple[dict, OpenAIRequest]:
    """The JSON object of a request body and its checked view.

    Raises:
        GatewayError: 400 for malformed JSON, a non-object body, or fields of the wrong type or range.
    """
    if not raw:
        raise GatewayError(400, "request body is empty; send a JSON object", code="invalid_json")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise GatewayError(400, f"request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return data, schema.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = f"invalid request: {validation_problems(error)}"
        raise GatewayError(400, message, param=param, code="invalid_value") from None


@dataclass
class Accounting:
    """Labels and timings of one proxied request, recorded once when it ends."""

    labels: tuple[str, str, str]
    endpoint: str
    started: float
    prompt_tokens: int = 0
    generation_tokens: int = 0


class Proxy:
    """Routes, checks and forwards OpenAI requests; records their metrics."""

    def __init__(self, settings: GatewaySettings, pool: BackendPool, router: Router, metrics: GatewayMetrics):
        self.settings, self.pool, self.router, self.metrics = settings, pool, router, metrics

    async def handle(self, request: Request, endpoint: str, schema: type[OpenAIRequest]) -> Response:
        """Answer one ``/v1/completions`` or ``/v1/chat/completions`` request."""
        started = time.perf_counter()
        route: Route | None = None
        try:
            raw = await read_body(request, self.settings.max_body_bytes)
            data, parsed = parse_request(raw, schema)
            user_key = parsed.user or request.headers.get(self.settings.user_header)
            try:
                route = self.router.route(
                    parsed.model, user_key, request.headers.get(self.settings.arm_header)
                )
            except RoutingError as error:
                raise GatewayError(error.status, str(error), param=error.param, code=error.code) from None
            backend, fallback_from = self._available_backend(route)
            self._check_length(parsed, backend)
            return await self._forward(
                request, endpoint, data, parsed, route, backend, fallback_from, started
            )
        except GatewayError as error:
            labels = self._labels(route, route.backend if route else "")
            self.metrics.requests.labels(*labels, endpoint, str(error.status)).inc()
            if route is not None:
                error.headers.update(self._route_headers(route, route.backend, None))
            return error.response()

    # -- decisions ----------------------------------------------------------------------------
    def _available_backend(self, route: Route) -> tuple[Backend, str | None]:
        backend = self.pool[route.backend]
        if backend.up:
            return backend, None
        if route.fallback is not None and self.pool[route.fallback].up:
            self.metrics.fallbacks.labels(route.experiment or "", route.arm or "", route.fallback).inc()
            return self.pool[route.fallback], backend.name
        raise self._unavailable(backend)

    def _unavailable(self, backend: Backend) -> GatewayError:
        state = "restarting" if backend.restarting else "down"
        detail = f": {backend.last_error}" if backend.last_error else ""
        return GatewayError(
            503,
            f"variant '{backend.name}' is unavailable ({state}{detail}); retry later",
            code="backend_unavailable",
            headers={"retry-after": "5"},
        )

    @staticmethod
    def _check_length(parsed: OpenAIRequest, backend: Backend) -> None:
        wanted = parsed.requested_output_tokens()
        if wanted is not None and backend.max_model_len is not None and wanted > backend.max_model_len:
            param = (
                "max_completion_tokens" if getattr(parsed, "max_completion_tokens", None) else "max_tokens"
            )
            raise GatewayError(
                400,
                f"{param}={wanted} exceeds the context length of model '{backend.name}' "
                f"({backend.max_model_len} tokens)",
                param=param,
                code="context_length_exceeded",
            )

    @staticmethod
    def _labels(route: Route | None, variant: str) -> tuple[str, str, str]:
        if route is None:
            return (variant, "", "")
        return (variant, route.experiment or "", route.arm or "")

    @staticmethod
    def _route_headers(route: Route, variant: str, fallback_from: str | None) -> dict[str, str]:
        headers = {VARIANT_HEADER: variant}
        if route.experiment is not None:
            headers[EXPERIMENT_HEADER] = route.experiment
            headers[ARM_HEADER] = route.arm or ""
        if fallback_from is not None:
            headers[FALLBACK_HEADER] = fallback_from
        return headers

    # -- forwarding ---------------------------------------------------------------------------
    async def _forward(
        self,
        request: Request,
        endpoint: str,
        data: dict,
        parsed: OpenAIRequest,
        route: Route,
        backend: Backend,
        fallback_from: str | None,
        started: float,
    ) -> Response:
        strip_usage = False
        if parsed.stream:
            options = data.get("stream_options") or {}
            strip_usage = not options.get("include_usage")
            data["stream_options"] = {**options, "include_usage": True}
        headers = {"content-type": "application/json"}
        for name in PASSED_REQUEST_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        in_flight = self.metrics.in_flight
        in_flight.labels(backend.name).inc()
        handed_to_stream = False
        try:
            try:
                upstream = await self._send(endpoint, data, headers, backend)
            except aiohttp.ClientConnectorError as error:
                # Nothing reached the backend, so trying the fallback cannot run the request twice.
                self.pool.suspect(backend, error)
                if fallback_from is not None or route.fallback is None or not self.pool[route.fallback].up:
                    raise self._unavailable(backend) from None
                in_flight.labels(backend.name).dec()
                fallback_from, backend = backend.name, self.pool[route.fallback]
                in_flight.labels(backend.name).inc()
                self.metrics.fallbacks.labels(route.experiment or "", route.arm or "", backend.name).inc()
                try:
                    upstream = await self._send(endpoint, data, headers, backend)
                except UPSTREAM_ERRORS as second:
                    self.pool.suspect(backend, second)
                    raise self._unavailable(backend) from None
            except UPSTREAM_ERRORS as error:
                self.pool.suspect(backend, error)
                raise self._unavailable(backend) from None

            accounting = Accounting(self._labels(route, backend.name), endpoint, started)
            response_headers = self._route_headers(route, backend.name, fallback_from)
            if parsed.stream and upstream.status == 200:
                handed_to_stream = True
                return self._stream(upstream, backend, accounting, response_headers, strip_usage)
            try:
                body = await upstream.read()
            except UPSTREAM_ERRORS as error:
                self.pool.suspect(backend, error)
                raise self._unavailable(backend) from None
            finally:
                upstream.release()
            return self._finish(upstream.status, body, backend, accounting, response_headers)
        finally:
            if not handed_to_stream:
                in_flight.labels(backend.name).dec()

    async def _send(
        self, endpoint: str, data: dict, headers: dict, backend: Backend
    ) -> aiohttp.ClientResponse:
        data["model"] = backend.served_model
        payload = json.dumps(data, separators=(",", ":")).encode()
        return await self.pool.session.post(f"{backend.url}{endpoint}", data=payload, headers=headers)

    def _finish(
        self, status: int, body: bytes, backend: Backend, accounting: Accounting, headers: dict[str, str]
    ) -> Response:
        if status == 200:
            self._count_usage(body, accounting)
        elif status >= 500:
            # An engine error is the backend's fault, not the client's: say so without a bare 500.
            message = _backend_message(body) or f"backend answered {status}"
            body = json.dumps(
                error_body(503, f"variant '{backend.name}' failed: {message}", code="backend_error")
            ).encode()
            status = 503
        elif not _is_openai_error(body):
            body = json.dumps(
                error_body(status, _backend_message(body) or f"backend answered {status}")
            ).encode()
        self._record(accounting, status)
        return Response(body, status_code=status, media_type="application/json", headers=headers)

    def _stream(
        self,
        upstream: aiohttp.ClientResponse,
        backend: Backend,
        accounting: Accounting,
        headers: dict[str, str],
        strip_usage: bool,
    ) -> StreamingResponse:
        metrics = self.metrics
        finished = False

        async def finish(status: str) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            # Closing (not releasing) an unfinished response drops the connection, which makes vLLM
            # abort the generation instead of finishing it for nobody.
            if status == "200":
                upstream.release()
            else:
                upstream.close()
            metrics.in_flight.labels(backend.name).dec()
            self._record(accounting, status)

        async def relay():
            status = "200"
            first = True
            pending = b""
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        metrics.ttft.labels(*accounting.labels).observe(
                            time.perf_counter() - accounting.started
                        )
                        first = False
                    # Only the usage event needs looking at; everything else passes through untouched.
                    if pending or b'"usage"' in chunk:
                        pending += chunk
                        cut = pending.rfind(b"\n\n") + 2
                        if cut < 2:
                            continue
                        complete, pending = pending[:cut], pending[cut:]
                        chunk = self._take_usage(complete, accounting, strip_usage)
                        if not chunk:
                            continue
                    yield chunk
                if pending:
                    yield pending
            except UPSTREAM_ERRORS as error:
                status = "503"
                self.pool.suspect(backend, error)
                message = f"variant '{backend.name}' stopped answering mid-stream: {type(error).__name__}"
                yield f"data: {json.dumps(error_body(503, message, code='backend_unavailable'))}\n\n".encode()
            except (asyncio.CancelledError, GeneratorExit):
                status = CLIENT_CLOSED
                raise
            finally:
                await finish(status)

        return RelayResponse(
            relay(), finish, status_code=200, media_type="text/event-stream", headers=headers
        )

    @staticmethod
    def _take_usage(events: bytes, accounting: Accounting, strip_usage: bool) -> bytes:
        kept = []
        for event in events.split(b"\n\n"):
            if not event:
                continue
            if b'"usage"' in event and event.startswith(b"data: {"):
                try:
                    payload = json.loads(event[6:])
                except ValueError:
                    payload = {}
                usage = payload.get("usage")
                if isinstance(usage, dict):
                    accounting.prompt_tokens = usage.get("prompt_tokens") or accounting.prompt_tokens
                    accounting.generation_tokens = (
                        usage.get("completion_tokens") or accounting.generation_tokens
                    )
                    if strip_usage:
                        if not payload.get("choices"):
                            continue  # the usage-only event the client did not ask for
                        payload.pop("usage")
                        event = b"data: " + json.dumps(payload, separators=(",", ":")).encode()
            kept.append(event + b"\n\n")
        return b"".join(kept)

    @staticmethod
    def _count_usage(body: bytes, accounting: Accounting) -> None:
        try:
            usage = json.loads(body).get("usage") or {}
        except (ValueError, AttributeError):
            return
        accounting.prompt_tokens = usage.get("prompt_tokens") or 0
        accounting.generation_tokens = usage.get("completion_tokens") or 0

    def _record(self, accounting: Accounting, status: int | str) -> None:
        metrics, labels = self.metrics, accounting.labels
        metrics.requests.labels(*labels, accounting.endpoint, str(status)).inc()
        metrics.e2e.labels(*labels).observe(time.perf_counter() - accounting.started)
        if accounting.prompt_tokens:
            metrics.prompt_tokens.labels(*labels).inc(accounting.prompt_tokens)
        if accounting.generation_tokens:
            metrics.generation_tokens.labels(*labels).inc(accounting.generation_tokens)


def _is_openai_error(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(payload, dict) and isinstance(payload.get("error"), dict) and "message" in payload["error"]
    )


def _backend_message(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip()
        return text[:500] or None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message"))
        if isinstance(error, str):
            return error
        if "detail" in payload:
            return str(payload["detail"])
        if "message" in payload:
            return str(payload["message"])
    return None
