"""HTTP handlers of the gateway: thin functions that read ``request.app.state`` and answer.

OpenAI API: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models[/{model}]``.
Operations: ``GET /health`` (liveness), ``GET /ready`` (every variant has a replica up), ``GET /metrics``
(the gateway's Prometheus metrics), ``GET /metrics/backends/{variant}[?replica=I]`` (that backend's own vLLM
metrics; of one replica when the variant has several, the first one up by default).
Admin (bearer ``--admin-token``): ``GET /admin/experiments``, ``GET|PUT|DELETE /admin/experiments/{name}``
(``ETag``/``If-Match`` by version), ``GET /admin/experiments/{name}/history``.
The schema of all of them: ``GET /openapi.json``.

What is open without the API key: ``/health``; ``/ready`` with each variant's up/down only (its URL, PID
and last error need the key); ``/metrics`` and ``/metrics/backends/*`` unless ``metrics_auth`` is set.
A gateway without an API key shows everything to everyone.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import asdict

import httpx
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from ground.core.errors import UserError
from server.errors import GatewayError, validation_problems
from server.experiment_sync import OutcomeUnknown, StoreUnavailable, spec_json
from server.protocol import ChatCompletionRequest, CompletionRequest, ExperimentSpec, ModelCard, ModelList
from server.proxy import read_body

router = APIRouter()
# The handlers read their bodies themselves (to answer bad JSON in OpenAI's shape), so FastAPI cannot see
# them: these are the bodies the OpenAPI schema documents, by (path, method).
REQUEST_BODIES = {
    ("/v1/completions", "post"): CompletionRequest,
    ("/v1/chat/completions", "post"): ChatCompletionRequest,
    ("/admin/experiments/{name}", "put"): ExperimentSpec,
}


def _bearer_ok(request: Request, secret: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), secret.encode())


def has_api_key(request: Request) -> bool:
    """True when the gateway needs no API key or the request carries it."""
    api_key = request.app.state.settings.api_key
    return not api_key or _bearer_ok(request, api_key)


def require_api_key(request: Request) -> None:
    """401 unless the request carries the gateway's API key (when one is configured)."""
    if not has_api_key(request):
        raise GatewayError(
            401,
            "missing or invalid API key: send 'Authorization: Bearer <key>'",
            code="invalid_api_key",
            headers={"www-authenticate": "Bearer"},
        )


def require_admin(request: Request) -> None:
    """403 when admin is disabled, 401 without the admin token."""
    token = request.app.state.settings.admin_token
    if not token:
        raise GatewayError(
            403, "the admin API is disabled: start the gateway with --admin-token", code="admin_disabled"
        )
    if not _bearer_ok(request, token):
        raise GatewayError(
            401,
            "missing or invalid admin token: send 'Authorization: Bearer <token>'",
            code="invalid_admin_token",
            headers={"www-authenticate": "Bearer"},
        )


# -- OpenAI API ---------------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """Text completion on a variant or an experiment arm (streaming with ``"stream": true``)."""
    require_api_key(request)
    return await request.app.state.proxy.handle(request, "/v1/completions", CompletionRequest)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """Chat completion on a variant or an experiment arm (streaming with ``"stream": true``)."""
    require_api_key(request)
    return await request.app.state.proxy.handle(request, "/v1/chat/completions", ChatCompletionRequest)


def model_cards(state) -> list[ModelCard]:
    """Every served variant and every experiment, as ``/v1/models`` shows them."""
    cards = []
    for backend in state.pool.variants.values():
        meta = backend.spec.metadata
        cards.append(
            ModelCard(
                id=backend.name,
                created=state.created,
                root=backend.spec.model_dir or backend.url,
                max_model_len=backend.max_model_len,
                status="up" if backend.up else "down",
                base_model=meta.base_model,
                removed_blocks=meta.removed_blocks,
                num_blocks=meta.num_blocks,
                objective=meta.objective,
                search=meta.search,
                variant_id=meta.variant_id,
                aliases=meta.aliases,
                speculative=meta.speculative,
            )
        )
    experiments = state.router.experiments if state.router.experiments_pending is None else {}
    for name, experiment in experiments.items():
        up = any(state.pool.variants[arm.backend].up for arm in experiment.arms)
        cards.append(
            ModelCard(
                id=name,
                created=state.created,
                kind="experiment",
                status="up" if up else "down",
                arms=experiment.describe(),
                comparison=experiment.comparison(),
            )
        )
    return cards


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """Variants (base model, removed blocks, objective) and experiments (arms and weights)."""
    require_api_key(request)
    return Response(
        ModelList(data=model_cards(request.app.state)).model_dump_json(), media_type="application/json"
    )


@router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> Response:
    """One entry of ``/v1/models``."""
    require_api_key(request)
    for card in model_cards(request.app.state):
        if card.id == model or model in card.aliases:
            return Response(card.model_dump_json(), media_type="application/json")
    _not_before_sync(request)
    raise GatewayError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")


# -- operations -----------------------------------------------------------------------------------
@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness: the gateway answers (backends may be down; see /ready)."""
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: 200 when every variant is up (at least one of its replicas), else 503; each variant's state
    (only up/down without the API key: URLs and PIDs are for operators)."""
    pool = request.app.state.pool
    detailed = has_api_key(request)
    backends = {
        name: variant.status() if detailed else {"up": variant.up} for name, variant in pool.variants.items()
    }
    shared = request.app.state.experiments
    experiments = shared.status()
    if not detailed:  # the registry's errors name hosts: for operators
        experiments = {key: experiments[key] for key in ("store", "in_sync")}
    reasons = [f"variant '{name}' is down" for name, variant in pool.variants.items() if not variant.up]
    if not shared.synced:  # it has no copy to route experiments by, not even an old one
        reasons.append("the experiments have not been read from the registry yet")
    body = {"ready": not reasons, "backends": backends, "experiments": experiments}
    if reasons:
        body["reasons"] = reasons
    return JSONResponse(body, status_code=503 if reasons else 200)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """The gateway's Prometheus metrics (behind the API key with ``metrics_auth``)."""
    state = request.app.state
    if state.settings.metrics_auth:
        require_api_key(request)
    for name, variant in state.pool.variants.items():
        state.metrics.backend_up.labels(name).set(1 if variant.up else 0)
    await read_spec_decode_counts(state)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def read_spec_decode_counts(state) -> None:
    """Read vLLM's acceptance counters of every speculative arm's engines into the gateway's metrics.

    An engine that does not answer keeps the arm's last reading (counters must not go back to 0).
    """
    import asyncio

    from server.metrics import spec_decode_counts

    async def read(backend) -> dict[str, float] | None:
        try:
            upstream = await state.pool.client.get(f"{backend.url}/metrics", timeout=5)
            return spec_decode_counts(upstream.text) if upstream.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    for name, variant in state.pool.variants.items():
        if variant.spec.speculative is None:
            continue
        readings = await asyncio.gather(*(read(backend) for backend in variant.replicas))
        if any(reading is None for reading in readings):
            continue
        totals: dict[str, float] = {}
        for reading in readings:
            for key, value in reading.items():
                totals[key] = totals.get(key, 0.0) + value
        state.metrics.spec_decode.counts[name] = totals


@router.get("/metrics/backends/{variant}")
async def backend_metrics(request: Request, variant: str, replica: int | None = None) -> Response:
    """The Prometheus metrics of one backend (vLLM's ``vllm:*`` families), fetched live: of replica
    ``replica`` when given, else of the first replica up."""
    state = request.app.state
    if state.settings.metrics_auth:
        require_api_key(request)
    name = state.router.variant_name(variant)
    if name is None:
        raise GatewayError(404, f"no backend named '{variant}'", param="variant", code="model_not_found")
    replicas = state.pool.variants[name].replicas
    if replica is not None and not 0 <= replica < len(replicas):
        raise GatewayError(
            404, f"variant '{name}' has replicas 0..{len(replicas) - 1}", param="replica", code="not_found"
        )
    backend = state.pool.variants[name] if replica is None else replicas[replica]
    try:
        upstream = await state.pool.client.get(f"{backend.url}/metrics", timeout=10)
    except httpx.TransportError as error:
        raise GatewayError(
            503,
            f"backend '{name}' did not answer /metrics: {type(error).__name__}",
            code="backend_unavailable",
        ) from None
    return Response(
        upstream.content,
        status_code=upstream.status_code,
        media_type=upstream.headers.get("content-type", "text/plain"),
    )


# -- admin: A/B experiments at runtime ------------------------------------------------------------
def _experiments_payload(state) -> dict:
    return {
        name: {
            "version": state.experiments.version(name),
            "arms": experiment.describe(),
            "sticky": experiment.spec.sticky,
            "fallback": experiment.spec.fallback,
            "forcible": experiment.spec.forcible,
        }
        for name, experiment in state.router.experiments.items()
    }


@router.get("/admin/experiments")
async def get_experiments(request: Request) -> Response:
    """Every experiment with its resolved arms and shares (503 until the registry has been read once)."""
    require_admin(request)
    _not_before_sync(request)
    return JSONResponse(_experiments_payload(request.app.state))


@router.get("/admin/experiments/{name}")
async def get_experiment(request: Request, name: str) -> Response:
    """One experiment: its spec, resolved arms and version; the ``ETag`` is the version."""
    require_admin(request)
    shared = request.app.state.experiments
    version = shared.version(name)
    if version is None:
        _not_before_sync(request)
        raise GatewayError(404, f"no experiment named '{name}'", code="experiment_not_found")
    body = {
        "name": name,
        "version": version,
        **_experiments_payload(request.app.state)[name],
        "spec": spec_json(request.app.state.router.experiments[name].spec),
    }
    return JSONResponse(body, headers={"etag": etag(version)})


@router.put("/admin/experiments/{name}")
async def put_experiment(request: Request, name: str) -> Response:
    """Create or replace an experiment; body ``{"arms": [{"objective"|"variant", "weight", ...}], ...}``.

    All or nothing: a refused experiment (400) changes nothing. With a registry the change is written there
    first and reaches every gateway on it. ``If-Match: "<version>"`` makes it conditional (412 when someone
    changed it since; ``If-None-Match: *`` creates only); without it the last writer wins, recorded all the
    same. Rolling back is PUTting an older spec from the history.
    """
    require_admin(request)
    state = request.app.state
    _check_name(name)
    raw = await read_body(request, state.settings.max_body_bytes, state.settings.body_timeout_s)
    spec = _parse_spec_body(name, raw)
    expected = expected_version(request, state.experiments.version(name))
    try:
        _, version = await state.experiments.put(name, spec, actor=_actor(request), expected_version=expected)
    except ValueError as error:
        raise GatewayError(400, f"invalid experiment '{name}': {error}", code="invalid_experiment") from None
    except UserError as error:
        raise _store_refusal(error) from None
    except (StoreUnavailable, OutcomeUnknown) as error:
        raise _store_unavailable(error) from None
    state.experiments_changed_at = time.time()
    body = {name: _experiments_payload(state)[name]} if name in state.router.experiments else {}
    return JSONResponse({**body, "version": version}, headers={"etag": etag(version)})


@router.delete("/admin/experiments/{name}")
async def delete_experiment(request: Request, name: str) -> Response:
    """Remove an experiment (everywhere, with a registry); its name then answers 404 like any unknown model.
    ``If-Match`` as for PUT."""
    require_admin(request)
    shared = request.app.state.experiments
    expected = expected_version(request, shared.version(name))
    try:
        version = await shared.delete(name, actor=_actor(request), expected_version=expected)
    except UserError as error:
        raise _store_refusal(error) from None
    except (StoreUnavailable, OutcomeUnknown) as error:
        raise _store_unavailable(error) from None
    return JSONResponse({"deleted": name, "version": version})


@router.get("/admin/experiments/{name}/history")
async def experiment_history(request: Request, name: str) -> Response:
    """Every change of an experiment, oldest first: version, time, actor, action, spec before and after."""
    require_admin(request)
    try:
        changes = await request.app.state.experiments.history(name)
    except StoreUnavailable as error:
        raise _store_unavailable(error) from None
    if not changes:
        raise GatewayError(404, f"experiment '{name}' has no history", code="experiment_not_found")
    return JSONResponse(
        {
            "name": name,
            "changes": [
                {**asdict(change), "changed_at": change.changed_at.isoformat()} for change in changes
            ],
        }
    )


def etag(version: int) -> str:
    """The strong ETag of an experiment's version."""
    return f'"{version}"'


def expected_version(request: Request, current: int | None) -> int | None:
    """The version a conditional write is based on: ``If-Match: "N"`` -> N, ``If-Match: *`` -> the one this
    gateway routes by, ``If-None-Match: *`` -> 0 (create only); None for an unconditional write.

    ``If-Match`` is compared as RFC 9110 §13.1.1 says: strongly (a weak tag ``W/"N"`` matches nothing, and
    ``"06"`` is not ``"6"``), and it may list several tags (``"7", "8"``): the one this gateway routes by is
    taken when listed, else the newest listed (the registry compares it once more, under its lock).

    Raises:
        GatewayError: 412 for an ``If-Match`` that can match no version (weak or malformed tags only, or
            ``*`` for an experiment that does not exist).
    """
    if request.headers.get("if-none-match", "").strip() == "*":
        return 0
    header = request.headers.get("if-match")
    if header is None:
        return None
    value = header.strip()
    if value == "*" and current is not None:
        return current
    listed = [tag.strip() for tag in value.split(",")]
    versions = [
        int(tag[1:-1])
        for tag in listed
        if len(tag) > 2 and tag[0] == tag[-1] == '"' and tag[1:-1].isascii() and tag[1:-1].isdigit()
        if tag[1:-1] == str(int(tag[1:-1]))  # the tags this gateway gives are canonical: "06" is not "6"
    ]
    if current is not None and current in versions:
        return current
    if versions:
        return max(versions)
    raise GatewayError(
        412, f"If-Match {header[:80]!r} matches no version of this experiment", code="precondition_failed"
    )


def _actor(request: Request) -> str:
    """Who makes an admin change: the ``x-depthprune-actor`` label (if sent) and the gateway."""
    label = request.headers.get("x-depthprune-actor", "admin").strip()[:64] or "admin"
    return f"{label} via {request.app.state.experiments.actor}"


def _store_refusal(error: UserError) -> GatewayError:
    from registry.experiments import ExperimentNotFound, StaleVersion

    if isinstance(error, StaleVersion):
        headers = {"etag": etag(error.current)} if error.current else {}
        return GatewayError(412, str(error), code="precondition_failed", headers=headers)
    if isinstance(error, ExperimentNotFound):
        return GatewayError(404, f"no experiment named '{error.name}'", code="experiment_not_found")
    return GatewayError(400, str(error), code="invalid_experiment")


def _store_unavailable(error: StoreUnavailable | OutcomeUnknown) -> GatewayError:
    """503 for a change that did not happen, 504 ``experiments_outcome_unknown`` for one that may have."""
    if isinstance(error, OutcomeUnknown):
        return GatewayError(504, str(error), code="experiments_outcome_unknown")
    return GatewayError(503, f"{error}; nothing changed", code="experiments_unavailable")


def _not_before_sync(request: Request) -> None:
    """503 with ``Retry-After`` for a name that may be an experiment while none are known yet."""
    pending = request.app.state.router.experiments_pending
    if pending is not None:
        raise GatewayError(
            503,
            f"the experiments are not loaded from the registry yet ({pending}); retry later",
            code="experiments_unavailable",
            headers={"retry-after": "1"},
        )


def _check_name(name: str) -> None:
    """400 naming ``name`` when it cannot name an experiment (before the body is read)."""
    from registry.experiments import check_experiment_name

    try:
        check_experiment_name(name)
    except UserError as error:
        raise GatewayError(400, str(error), param="name", code="invalid_experiment") from None


def _parse_spec_body(name: str, raw: bytes) -> ExperimentSpec:
    """The PUT body as a spec, or 400 naming the first field that is wrong."""
    try:
        return ExperimentSpec.model_validate_json(raw)
    except ValidationError as error:
        first = error.errors()[0]
        raise GatewayError(
            400,
            f"invalid experiment '{name}': {validation_problems(error)}",
            param=".".join(map(str, first["loc"])) or None,
            code="invalid_experiment",
        ) from None
