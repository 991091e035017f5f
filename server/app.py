"""The gateway application: ``create_app(settings)`` wires backends, router, proxy and metrics together.

The lifespan owns the backends: it starts the managed vLLM processes (unless the caller already did,
as ``depthprune serve`` does to report start errors before serving), opens the pooled HTTP clients and
the health monitor, and on shutdown stops every process it started. Every error, including the
framework's own (unknown route, wrong method), is answered in OpenAI's error shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from server.backends import Backend, BackendPool
from server.errors import GatewayError, error_response
from server.experiment_sync import SharedExperiments, gateway_actor, parse_spec
from server.experiments import Router
from server.guardrails import Guardrails
from server.metrics import GatewayMetrics
from server.proxy import Proxy
from server.routes import REQUEST_BODIES
from server.routes import router as routes
from server.settings import GatewaySettings
from server.shadow import ShadowScorer
from server.ui import install_ui

log = logging.getLogger("depthprune.server")


def build_router(settings: GatewaySettings, seed: int | None = None) -> Router:
    """A router over the settings' variants with the settings' experiments installed.

    Raises:
        ValueError: an experiment is malformed or names nothing served (message says which).
    """
    router = Router({spec.name: spec.metadata for spec in settings.backends}, seed=seed)
    for name, raw in settings.experiments.items():
        spec = parse_spec(name, raw)
        try:
            router.set_experiment(name, spec)
        except ValueError as error:
            raise ValueError(f"experiment {name!r}: {error}") from None
    return router


def create_app(
    settings: GatewaySettings, pool: BackendPool | None = None, seed: int | None = None
) -> FastAPI:
    """The FastAPI gateway for ``settings``.

    Args:
        settings: backends, experiments and limits.
        pool: backends already started (``BackendPool.start_backends``); None starts them in the lifespan.
        seed: seed of the random arm choice for requests without a user key (tests).

    Returns:
        The ASGI application; run it with uvicorn.
    """
    from ground.core.errors import UserError

    try:
        router = build_router(settings, seed)
    except ValueError as error:
        raise UserError(str(error)) from None
    metrics = GatewayMetrics()
    shared = SharedExperiments(
        router,
        metrics.registry,
        registry_url=settings.experiments_registry,
        seed={name: parse_spec(name, raw) for name, raw in settings.experiments.items()},
        actor=gateway_actor(settings.host, settings.port),
        poll_interval_s=settings.experiments_poll_s,
        forget=metrics.forget,
    )
    if pool is None:
        pool = BackendPool(settings)
    on_backend_change = backend_metrics_updater(metrics, pool)
    pool.on_change = on_backend_change
    guardrails = Guardrails(shared, metrics, settings.guardrail_interval_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await pool.open()
        for backend in pool.backends.values():
            on_backend_change(backend)
        await shared.start()
        app.state.shadow = ShadowScorer(settings, pool, router, metrics)  # its queue needs the running loop
        app.state.proxy.shadow = app.state.shadow
        app.state.shadow.start()
        guardrails.start()
        app.state.series.start()
        try:
            yield
        finally:
            await app.state.series.stop()
            await guardrails.stop()
            await app.state.shadow.stop()
            await shared.stop()
            await app.state.proxy.close()
            await pool.close()

    # No trailing-slash redirects: Starlette builds their Location from the Host header, which the client
    # chooses; a path with a slash it does not serve is a 404 like any other.
    app = FastAPI(
        title="depthprune gateway", lifespan=lifespan, docs_url=None, redoc_url=None, redirect_slashes=False
    )
    app.openapi = lambda: gateway_openapi(app)
    app.state.settings = settings
    app.state.pool = pool
    app.state.router = router
    app.state.experiments = shared
    app.state.metrics = metrics
    app.state.guardrails = guardrails
    app.state.proxy = Proxy(settings, pool, router, metrics)
    app.state.created = int(time.time())
    app.include_router(routes)
    install_ui(app)  # the experiment page, /ui/, and its sampler (server/ui.py)
    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected_error)
    return app


def gateway_openapi(app: FastAPI) -> dict:
    """The gateway's OpenAPI schema (``/openapi.json``) with the request bodies of ``REQUEST_BODIES``.

    Returns:
        The schema, made once per app.
    """
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for (path, method), model in REQUEST_BODIES.items():
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            schema["paths"][path][method]["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
                },
            }
        app.openapi_schema = schema
    return app.openapi_schema


def backend_metrics_updater(metrics: GatewayMetrics, pool: BackendPool) -> Callable[[Backend], None]:
    """A ``BackendPool.on_change`` hook keeping the ``backend_up`` and ``replica_up`` gauges and the restart
    counter (of all replicas of a variant together) current."""
    restarts_seen: dict[str, int] = {}

    def on_backend_change(backend: Backend) -> None:
        variant = pool.variants[backend.name]
        metrics.backend_up.labels(backend.name).set(1 if variant.up else 0)
        metrics.replica_up.labels(backend.name, str(backend.replica)).set(1 if backend.up else 0)
        new = backend.restarts - restarts_seen.get(backend.key, 0)
        if new > 0:
            metrics.backend_restarts.labels(backend.name).inc(new)
            restarts_seen[backend.key] = backend.restarts

    return on_backend_change


async def gateway_error(request: Request, error: GatewayError):
    """A gateway error raised by a handler, answered as it says."""
    return error.response()


async def http_error(request: Request, error: StarletteHTTPException):
    """The framework's HTTP errors (unknown route, wrong method), with a message naming the request."""
    message = {
        404: f"no route {request.method} {request.url.path}",
        405: f"method {request.method} not allowed on {request.url.path}",
    }.get(error.status_code, str(error.detail))
    return error_response(error.status_code, message, headers=getattr(error, "headers", None))


async def validation_error(request: Request, error: RequestValidationError):
    """A request body that does not validate: 400 naming the first problem and its field."""
    first = error.errors()[0] if error.errors() else {"msg": "invalid request", "loc": ()}
    return error_response(
        400,
        f"invalid request: {first['msg']}",
        param=".".join(str(p) for p in first.get("loc", ())) or None,
        code="invalid_value",
    )


async def unexpected_error(request: Request, error: Exception):
    """Anything else: logged with its traceback, answered 500 without internals."""
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, f"internal gateway error: {type(error).__name__}", code="internal_error")
