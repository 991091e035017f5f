"""Forward one OpenAI request to the backend that serves it, streaming or not, and account for it.

The request body is parsed once (to route and to check it), the ``model`` field is rewritten to the
backend's served name, and the answer is relayed as the backend sends it: a non-streaming body as is, a
stream chunk by chunk with no re-framing (only the final usage event is looked at). Streams get
``stream_options.include_usage`` so the token counters are exact; the usage event is dropped again
when the client did not ask for it, so clients see exactly what vLLM would have sent them.

Failures are told apart by what they say about the backend. A request that fails on a kept-alive
connection before any answer (the backend closed it just as the request went out) is sent once more on a
new connection; any other failure answers 503 and asks the pool to check the backend's ``/health``, which
alone marks it down. A stream is committed (200) only once its first event is in: vLLM checks a request in
the engine's first step and reports a refusal as the first event, which the gateway answers as the 4xx it is.

A variant with several replicas (:mod:`server.replicas`) gets each request on the replica with the fewest
outstanding; a replica that refused the connection (nothing reached it) passes the request on to a sibling
that is up, and only when all refused to the arm's fallback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

import aiohttp
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from server.backends import Backend, BackendPool
from server.errors import GatewayError, error_body, openai_error_type, validation_problems
from server.experiments import Route, Router, RoutingError
from server.metrics import GatewayMetrics, wire_value
from server.protocol import OpenAIRequest
from server.replicas import ReplicaSet
from server.settings import GatewaySettings
from server.shadow import ShadowJob, ShadowScorer, TokenCapture

VARIANT_HEADER = "x-depthprune-variant"
EXPERIMENT_HEADER = "x-depthprune-experiment"
ARM_HEADER = "x-depthprune-arm"
FALLBACK_HEADER = "x-depthprune-fallback-from"
PASSED_REQUEST_HEADERS = ("x-request-id", "traceparent")
# Failures of the backend connection: the request is answered 503 and the backend's health checked.
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# How a kept-alive connection that the backend closed fails when a request is sent on it.
STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
CLIENT_CLOSED = "499"  # status label of a stream the client left (nginx's convention)
MAX_JSON_DEPTH = 100  # far deeper than any OpenAI request, tool schemas included
FIRST_EVENT_LIMIT = 64 * 1024  # bytes read, at most, while waiting for a stream's first event

log = logging.getLogger("depthprune.server")


class ConnectionRefused(Exception):
    """Every replica of a variant refused the connection: nothing reached it, so a fallback may run it."""

    def __init__(self, unavailable: GatewayError):
        super().__init__(str(unavailable))
        self.unavailable = unavailable
        """The 503 to answer when there is no fallback."""


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


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading them all.

    Raises:
        GatewayError: 413 for an oversize body, 408 when it has not all arrived within ``timeout_s``
            (uvicorn's keep-alive timeout does not cover a stalled body), 400 when the client went away.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    try:
        return await asyncio.wait_for(_collect_body(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise GatewayError(
            408,
            f"the request body did not arrive within {timeout_s:g} s",
            code="request_timeout",
            headers={"connection": "close"},
        ) from None
    except ClientDisconnect:
        raise GatewayError(
            400, "client disconnected while sending the body", code="client_disconnected"
        ) from None


async def _collect_body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")


def parse_request(raw: bytes, schema: type[OpenAIRequest]) -> tuple[dict, OpenAIRequest]:
    """The JSON object of a request body and its checked view.

    Raises:
        GatewayError: 400 for malformed JSON, a non-object body, or fields of the wrong type or range.
    """
    if not raw:
        raise GatewayError(400, "request body is empty; send a JSON object", code="invalid_json")
    too_deep = GatewayError(
        400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep", code="invalid_json"
    )
    try:
        data = json.loads(raw)
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as error:
        raise GatewayError(400, f"request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "request body must be a JSON object", code="invalid_json")
    # Deep but parseable JSON would fail again, deeper in the stack, when it is written for the backend.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth(data) > MAX_JSON_DEPTH:
        raise too_deep
    try:
        return data, schema.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = f"invalid request: {validation_problems(error)}"
        raise GatewayError(400, message, param=param, code="invalid_value") from None


def json_depth(value) -> int:
    """How deeply lists and objects nest in a parsed JSON value (0 for a scalar), without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


@dataclass
class Accounting:
    """Labels and timings of one proxied request, recorded once when it ends."""

    labels: tuple[str, str, str]
    endpoint: str
    started: float
    first_event_at: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    route: Route | None = None
    capture: TokenCapture | None = None
    """The token ids of a request sampled for shadow scoring; None for the others."""


class Proxy:
    """Routes, checks and forwards OpenAI requests; records their metrics."""

    def __init__(
        self,
        settings: GatewaySettings,
        pool: BackendPool,
        router: Router,
        metrics: GatewayMetrics,
        shadow: ShadowScorer | None = None,
    ):
        self.settings, self.pool, self.router, self.metrics = settings, pool, router, metrics
        self.shadow = shadow
        self._sampler = random.Random()
        # Tells a request whether it went out on a kept-alive connection (only those are retried).
        reuse_tracer = aiohttp.TraceConfig()
        reuse_tracer.on_connection_reuseconn.append(_note_reused_connection)
        pool.trace_configs.append(reuse_tracer)
        self._fresh_session: aiohttp.ClientSession | None = None

    def _fresh_connections(self) -> aiohttp.ClientSession:
        """A session that opens a new connection for every request: the retry must not pick another
        kept-alive connection that the backend is closing too."""
        if self._fresh_session is None:
            pooled = self.pool.session
            self._fresh_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=pooled.timeout,
                headers=pooled.headers,
            )
        return self._fresh_session

    async def close(self) -> None:
        """Close the retry session (the pool closes the pooled one)."""
        if self._fresh_session is not None:
            await self._fresh_session.close()
            self._fresh_session = None

    async def handle(self, request: Request, endpoint: str, schema: type[OpenAIRequest]) -> Response:
        """Answer one ``/v1/completions`` or ``/v1/chat/completions`` request."""
        started = time.perf_counter()
        route: Route | None = None
        try:
            raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
            data, parsed = parse_request(raw, schema)
            user_key = parsed.user or request.headers.get(self.settings.user_header)
            try:
                route = self.router.route(
                    parsed.model, user_key, request.headers.get(self.settings.arm_header)
                )
            except RoutingError as error:
                retry = {"retry-after": "1"} if error.status == 503 else {}
                raise GatewayError(
                    error.status, str(error), param=error.param, code=error.code, headers=retry
                ) from None
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
    def _available_backend(self, route: Route) -> tuple[ReplicaSet, str | None]:
        variants = self.pool.variants
        backend = variants[route.backend]
        if backend.up:
            return backend, None
        if route.fallback is not None and variants[route.fallback].up:
            self.metrics.fallbacks.labels(*self._labels(route, "")[1:], route.fallback).inc()
            return variants[route.fallback], backend.name
        raise self._unavailable(backend)

    def _failed(self, backend: Backend, error: Exception) -> GatewayError:
        """Mark ``backend`` suspect after ``error`` (the pool checks it now), and the 503 to answer."""
        self.pool.suspect(backend, error)
        return self._unavailable(backend)

    def _unavailable(self, backend: Backend | ReplicaSet) -> GatewayError:
        state = "restarting" if backend.restarting else "down"
        detail = f": {backend.last_error}" if backend.last_error else ""
        return GatewayError(
            503,
            f"variant '{backend.name}' is unavailable ({state}{detail}); retry later",
            code="backend_unavailable",
            headers={"retry-after": "5"},
        )

    @staticmethod
    def _check_length(parsed: OpenAIRequest, backend: ReplicaSet) -> None:
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

    def _labels(self, route: Route | None, variant: str) -> tuple[str, str, str]:
        """The metric labels of a request: its experiment and arm only while the experiment still routes
        that arm here, so that a request ending after a delete cannot bring the deleted series back."""
        if route is None or route.experiment is None:
            return (variant, "", "")
        experiment = self.router.experiments.get(route.experiment)
        if experiment is None or route.arm not in experiment.by_name:
            return (variant, "", "")
        return (variant, wire_value(route.experiment), wire_value(route.arm or ""))

    def _sample_for_shadow(self, route: Route, data: dict) -> TokenCapture | None:
        """Whether this request is shadow-scored (the experiment's ``shadow_rate``): if so, ask vLLM for the
        token ids, to be taken out of the answer again unless the client asked for them too."""
        experiment = self.router.experiments.get(route.experiment or "")
        if self.shadow is None or experiment is None or experiment.spec.shadow_rate <= 0:
            return None
        if data.get("echo"):
            return None  # vLLM does not echo the prompt's text when asked for its ids: the answer changes
        if self._sampler.random() >= experiment.spec.shadow_rate:
            return None
        asked = data.get("return_token_ids") is True
        data["return_token_ids"] = True
        return TokenCapture(strip=not asked)

    def _submit_shadow(self, accounting: Accounting) -> None:
        """(after the answer is sent) Queue a sampled completion for scoring by the experiment's control."""
        route, capture = accounting.route, accounting.capture
        experiment = self.router.experiments.get(route.experiment or "")
        control = experiment.by_name.get(experiment.control) if experiment is not None else None
        job = ShadowJob(
            route.experiment or "",
            route.arm or "",
            control.backend if control is not None else "",
            capture.prompt_ids or [],
            capture.generated_ids,
        )
        self.shadow.submit(job)

    @staticmethod
    def _route_headers(route: Route, variant: str, fallback_from: str | None) -> dict[str, str]:
        headers = {VARIANT_HEADER: variant}
        if route.experiment is not None:
            headers[EXPERIMENT_HEADER] = route.experiment
            headers[ARM_HEADER] = route.arm or ""
        if fallback_from is not None:
            headers[FALLBACK_HEADER] = fallback_from
        return {name: wire_value(value) for name, value in headers.items()}

    # -- forwarding ---------------------------------------------------------------------------
    async def _forward(
        self,
        request: Request,
        endpoint: str,
        data: dict,
        parsed: OpenAIRequest,
        route: Route,
        variant: ReplicaSet,
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
        capture = self._sample_for_shadow(route, data)
        upstream, backend, fallback_from = await self._send_or_fall_back(
            endpoint, data, headers, route, variant, fallback_from
        )
        handed_to_stream = False
        try:
            accounting = Accounting(self._labels(route, backend.name), endpoint, started, route=route)
            accounting.capture = capture
            if capture is not None and fallback_from is not None:
                accounting.capture = TokenCapture(strip=capture.strip, scored=False)  # not the arm's answer
            response_headers = self._route_headers(route, backend.name, fallback_from)
            if parsed.stream and upstream.status == 200:
                first = await self._first_event(upstream, backend)
                accounting.first_event_at = time.perf_counter()
                refusal = _stream_refusal(first)
                if refusal is None:
                    handed_to_stream = True
                    return self._stream(upstream, first, backend, accounting, response_headers, strip_usage)
                status, body = refusal
            else:
                status, body = upstream.status, await self._read(upstream, backend)
            return self._finish(status, body, backend, accounting, response_headers)
        finally:
            if not handed_to_stream:
                upstream.release()
                self._leave(backend)

    async def _send_or_fall_back(
        self,
        endpoint: str,
        data: dict,
        headers: dict,
        route: Route,
        variant: ReplicaSet,
        fallback_from: str | None,
    ) -> tuple[aiohttp.ClientResponse, Backend, str | None]:
        """The response headers of a replica of ``variant``, or of the arm's fallback when every replica
        refused the connection.

        The replica that answered is counted in flight and outstanding; the caller ends that with
        :meth:`_leave`.
        """
        try:
            upstream, replica = await self._send_to_variant(endpoint, data, headers, variant)
            return upstream, replica, fallback_from
        except ConnectionRefused as refused:
            fallback = self.pool.variants.get(route.fallback) if route.fallback else None
            if fallback_from is not None or fallback is None or not fallback.up:
                raise refused.unavailable from None
        fallback_from = variant.name
        self.metrics.fallbacks.labels(*self._labels(route, "")[1:], fallback.name).inc()
        try:
            upstream, replica = await self._send_to_variant(endpoint, data, headers, fallback)
        except ConnectionRefused as refused:
            raise refused.unavailable from None
        return upstream, replica, fallback_from

    async def _send_to_variant(
        self, endpoint: str, data: dict, headers: dict, variant: ReplicaSet
    ) -> tuple[aiohttp.ClientResponse, Backend]:
        """Send to the replica :meth:`ReplicaSet.choose_replica` picks; to the next one up when it refused the
        connection (nothing reached it, so no request runs twice), after asking the pool to check it.

        Raises:
            ConnectionRefused: every replica that was up refused the connection.
            GatewayError: 503 when the request failed after it may have reached a replica.
        """
        tried: list[Backend] = []
        unavailable = self._unavailable(variant)
        while (replica := variant.choose_replica(exclude=tried)) is not None:
            tried.append(replica)
            self._enter(replica)
            try:
                return await self._send(endpoint, data, headers, replica), replica
            except BaseException as error:  # the client leaving cancels the request: no longer in flight
                self._leave(replica)
                if not isinstance(error, UPSTREAM_ERRORS):
                    raise
                unavailable = self._failed(replica, error)
                if not isinstance(error, aiohttp.ClientConnectorError):
                    raise unavailable from None
        raise ConnectionRefused(unavailable)

    def _enter(self, replica: Backend) -> None:
        """Count a request sent to ``replica``: in flight for its variant, outstanding for the choice."""
        replica.outstanding += 1
        labels = (replica.name, str(replica.replica))
        self.metrics.in_flight.labels(replica.name).inc()
        self.metrics.replica_in_flight.labels(*labels).inc()
        self.metrics.replica_requests.labels(*labels).inc()

    def _leave(self, replica: Backend) -> None:
        """The request sent to ``replica`` is answered (or abandoned)."""
        replica.outstanding -= 1
        self.metrics.in_flight.labels(replica.name).dec()
        self.metrics.replica_in_flight.labels(replica.name, str(replica.replica)).dec()

    async def _send(
        self, endpoint: str, data: dict, headers: dict, backend: Backend
    ) -> aiohttp.ClientResponse:
        """POST the request; once more on a new connection when a kept-alive one failed before any answer.

        The backend closes an idle connection when its own keep-alive runs out, and a request sent at that
        moment fails although the backend is fine. Only such a request is sent again: one that failed on a
        new connection may have reached the backend, and it is not run twice.
        """
        data["model"] = backend.served_model
        payload = json.dumps(data, separators=(",", ":")).encode()
        url = f"{backend.url}{endpoint}"
        attempt = {"reused": False}
        try:
            return await self.pool.session.post(url, data=payload, headers=headers, trace_request_ctx=attempt)
        except STALE_CONNECTION_ERRORS as error:
            if isinstance(error, aiohttp.ClientConnectorError) or not attempt["reused"]:
                raise
            log.info("kept-alive connection to backend %s failed (%r); sending again", backend.name, error)
        self.metrics.upstream_retries.labels(backend.name).inc()
        return await self._fresh_connections().post(url, data=payload, headers=headers)

    async def _read(self, upstream: aiohttp.ClientResponse, backend: Backend) -> bytes:
        try:
            return await upstream.read()
        except UPSTREAM_ERRORS as error:
            raise self._failed(backend, error) from None

    async def _first_event(self, upstream: aiohttp.ClientResponse, backend: Backend) -> bytes:
        """What the stream sends up to the end of its first event (or its end, or 64 KiB)."""
        first = b""
        try:
            while b"\n\n" not in first and len(first) < FIRST_EVENT_LIMIT:
                chunk = await upstream.content.readany()
                if not chunk:
                    break
                first += chunk
        except UPSTREAM_ERRORS as error:
            raise self._failed(backend, error) from None
        return first

    def _finish(
        self, status: int, body: bytes, backend: Backend, accounting: Accounting, headers: dict[str, str]
    ) -> Response:
        background = None
        if status == 200:
            self._count_usage(body, accounting)
            if accounting.capture is not None:
                body = accounting.capture.take_body(body)
                if accounting.capture.scored:
                    background = BackgroundTask(self._submit_shadow, accounting)
        elif status >= 500:
            # An engine error is the backend's fault, not the client's: say so without a bare 500.
            message = _backend_message(body) or f"backend answered {status}"
            body = json.dumps(
                error_body(503, f"variant '{backend.name}' failed: {message}", code="backend_error")
            ).encode()
            status = 503
        else:
            body = _openai_error(status, body)
        self._record(accounting, status)
        return Response(
            body, status_code=status, media_type="application/json", headers=headers, background=background
        )

    def _stream(
        self,
        upstream: aiohttp.ClientResponse,
        first: bytes,
        backend: Backend,
        accounting: Accounting,
        headers: dict[str, str],
        strip_usage: bool,
    ) -> StreamingResponse:
        metrics = self.metrics
        labels = self._labels(accounting.route, accounting.labels[0])
        metrics.ttft.labels(*labels).observe(accounting.first_event_at - accounting.started)
        capture = accounting.capture
        finished = delivered = False

        async def finish(status: str) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            if status == CLIENT_CLOSED and delivered:
                # The client left after the stream's last event ([DONE]) was handed over, as the openai
                # client does: the answer was complete, so it counts (and is shadow-scored) as one.
                status = "200"
            # Closing (not releasing) an unfinished response drops the connection, which makes vLLM
            # abort the generation instead of finishing it for nobody.
            if status == "200":
                upstream.release()
            else:
                upstream.close()
            self._leave(backend)
            self._record(accounting, status)
            if status == "200" and capture is not None and capture.scored:
                self._submit_shadow(accounting)  # the last byte is out: scoring cannot delay it

        async def upstream_chunks():
            if first:
                yield first
            async for chunk in upstream.content.iter_any():
                yield chunk

        async def relay():
            nonlocal delivered
            status = "200"
            pending = b""
            try:
                async for chunk in upstream_chunks():
                    # Only the usage event needs looking at (every event of a shadow-sampled stream, for
                    # its token ids); everything else passes through untouched.
                    if pending or capture is not None or b'"usage"' in chunk:
                        pending += chunk
                        cut = pending.rfind(b"\n\n") + 2
                        if cut < 2:
                            continue
                        complete, pending = pending[:cut], pending[cut:]
                        chunk = self._take_usage(complete, accounting, strip_usage)
                        if capture is not None:
                            chunk = capture.take_events(chunk)
                        if not chunk:
                            continue
                    delivered = delivered or b"data: [DONE]" in chunk
                    yield chunk
                if pending:
                    delivered = delivered or b"data: [DONE]" in pending
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
        metrics = self.metrics
        labels = self._labels(accounting.route, accounting.labels[0])
        metrics.requests.labels(*labels, accounting.endpoint, str(status)).inc()
        finished = time.perf_counter()
        answered = str(status).startswith("2")
        metrics.observe_latency(labels, "e2el", finished - accounting.started, answered)
        if accounting.first_event_at and accounting.generation_tokens > 1:
            tpot = (finished - accounting.first_event_at) / (accounting.generation_tokens - 1)
            metrics.observe_latency(labels, "tpot", tpot, answered)
        if accounting.prompt_tokens:
            metrics.prompt_tokens.labels(*labels).inc(accounting.prompt_tokens)
        if accounting.generation_tokens:
            metrics.generation_tokens.labels(*labels).inc(accounting.generation_tokens)


async def _note_reused_connection(session, context, params) -> None:
    """aiohttp trace hook: the request went out on a kept-alive connection."""
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = True


def _openai_error(status: int, body: bytes) -> bytes:
    """A backend's 4xx answer in OpenAI's error shape, with OpenAI's ``type`` in place of vLLM's."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not (isinstance(error, dict) and "message" in error):
        return json.dumps(error_body(status, _backend_message(body) or f"backend answered {status}")).encode()
    error = {**error, "type": openai_error_type(status, error.get("type"))}
    return json.dumps({**payload, "error": error}).encode()


def _stream_refusal(first: bytes) -> tuple[int, bytes] | None:
    """``(status, error body)`` when a stream's first event is vLLM refusing the request, else None.

    vLLM sends ``data: {"error": {"message", "type", "param", "code": STATUS}}`` (older versions: the error
    fields at the top with ``"object": "error"``).
    """
    if not first.startswith(b"data: {") or b"error" not in first:
        return None
    try:
        payload = json.loads(first[6:].split(b"\n\n", 1)[0])
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    error = payload.get("error") if isinstance(payload.get("error"), dict) else None
    if error is None and payload.get("object") == "error":
        error = {key: payload.get(key) for key in ("message", "type", "param", "code")}
    if error is None:
        return None
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 400
    return status, json.dumps({"error": error}).encode()


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
