"""The experiment page: ``/ui/`` lists the experiments, ``/ui/experiments/NAME`` shows one as it runs.

The page is static (``server/static/``: an HTML shell, its script and style, and uPlot, the charting library,
vendored from npm at a pinned version) and fetches its data as JSON from the endpoints below, every second,
with the token the person typed into its login form (kept in the tab's ``sessionStorage``, sent as
``Authorization: Bearer``, never in a URL):

* ``GET /ui/api/experiments``: every experiment with its arms, weights, version and latest verdicts;
* ``GET /ui/api/experiments/{name}``: one experiment's spec and version, its arms (variant, removed blocks,
  weight, share, the ideal TPOT ratio and whether the latest ratio lies wholly below it), the latest sampled
  figures (:mod:`server.experiment_series`), guardrail stops and the change history;
* ``GET /ui/api/experiments/{name}/series?after=SEQ``: the sampled points after ``SEQ`` (the charts).

Who may look: the admin token or, when the gateway has one, the API key; a gateway with neither shows the
page to everyone, as it shows everything else. The data endpoints answer 401 without it; the HTML and assets
carry no data. Stopping an arm is the page calling the admin API itself (``PUT /admin/experiments/{name}``
with ``If-Match`` on the version it shows), so it needs the admin token and leaves the same history entry as
any operator change; everything here is read-only.

Every response of ``/ui`` carries a Content-Security-Policy that allows scripts and styles from the gateway
only (no inline script, no ``eval``), no framing and no form submission; the script builds the page with DOM
text nodes, never HTML strings, so a name shows as the characters it holds.

Install with :func:`install_ui` (``create_app`` does).
"""

from __future__ import annotations

import hmac
import json
import math
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import JSONResponse, Response

from server.errors import GatewayError
from server.experiment_comparison import against_ideal
from server.experiment_report import guardrail_stops
from server.experiment_series import FIELDS, SeriesSampler
from server.experiment_sync import StoreUnavailable, spec_json

router = APIRouter()

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}
ASSETS = {
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
"""The files of ``server/static`` the gateway serves, and their types (nothing else is served from there)."""
HISTORY_SHOWN = 200
"""The newest changes an experiment's page lists (the admin API has them all)."""


def install_ui(app: FastAPI) -> None:
    """Add the page's routes and its sampler (``app.state.series``, started and stopped by the lifespan)."""
    settings = app.state.settings
    app.state.series = SeriesSampler(
        app.state.router,
        app.state.metrics,
        interval_s=settings.series_interval_s,
        max_points=settings.series_points,
        peers=settings.peers,
        api_key=settings.api_key,
    )
    app.state.ui_history = {}
    app.state.ui_answers = {}
    """The last answer of each data endpoint, by what it depends on: a page polling every second costs this
    gateway a lookup, not a new JSON document, until a sample or a change makes a new one."""
    app.include_router(router)


@cache
def asset(name: str) -> bytes:
    """A file of ``server/static`` (read once)."""
    return resources.files("server").joinpath("static", name).read_bytes()


def _page_response() -> Response:
    return Response(asset("page.html"), media_type="text/html; charset=utf-8", headers=_headers(True))


def _headers(no_store: bool) -> dict[str, str]:
    return {**SECURITY_HEADERS, "cache-control": "no-store" if no_store else "no-cache"}


def _json(body: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(_finite(body), status_code=status_code, headers=_headers(True))


def _finite(value: Any) -> Any:
    """``value`` with every non-finite number as None (JSON has no NaN; a figure not defined yet is null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def viewer(request: Request) -> dict[str, bool]:
    """Who is asking: ``{"admin": holds the admin token}``.

    Raises:
        GatewayError: 401 without the admin token or (where the gateway has one) the API key.
    """
    settings = request.app.state.settings
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip().encode() if scheme.lower() == "bearer" else b""

    def holds(secret: str | None) -> bool:
        return bool(secret) and hmac.compare_digest(token, secret.encode())

    admin = holds(settings.admin_token)
    if not admin and not holds(settings.api_key) and (settings.admin_token or settings.api_key):
        raise GatewayError(
            401,
            "the experiment page needs the admin token or the API key: send 'Authorization: Bearer <token>'",
            code="invalid_token",
            headers={"www-authenticate": "Bearer", **SECURITY_HEADERS},
        )
    return {"admin": admin}


# -- the page and its files ----------------------------------------------------------------------
@router.get("/ui", include_in_schema=False)
async def ui_root() -> Response:
    """The list of experiments (the same page as ``/ui/``; no redirect, see ``create_app``)."""
    return _page_response()


@router.get("/ui/", include_in_schema=False)
async def ui_index() -> Response:
    """The list of experiments."""
    return _page_response()


@router.get("/ui/experiments/{name}", include_in_schema=False)
async def ui_experiment(name: str) -> Response:
    """One experiment's page (the script reads the name from the address)."""
    return _page_response()


@router.get("/ui/static/{name}", include_in_schema=False)
async def ui_asset(name: str) -> Response:
    """The page's script and style and the vendored uPlot."""
    if name not in ASSETS:
        raise GatewayError(404, f"no file {name!r}", code="not_found")
    return Response(asset(name), media_type=ASSETS[name], headers=_headers(False))


# -- the page's data -----------------------------------------------------------------------------
def _cached(state, key: tuple) -> Response | None:
    """The answer already made for ``key`` (what it shows changes only with a sample or a version)."""
    hit = state.ui_answers.get(key[0])
    return (
        Response(hit[1], media_type="application/json", headers=_headers(True))
        if hit and hit[0] == key
        else None
    )


def _keep(state, key: tuple, response: JSONResponse) -> JSONResponse:
    if len(state.ui_answers) > 256:  # deleted experiments' answers go at some point
        state.ui_answers.clear()
    state.ui_answers[key[0]] = (key, response.body)
    return response


@router.get("/ui/api/experiments")
async def ui_experiments(request: Request) -> Response:
    """Every experiment this gateway routes: arms with weights and shares, version, latest verdicts."""
    who = viewer(request)
    state = request.app.state
    versions = tuple((name, state.experiments.version(name)) for name in state.router.experiments)
    pending = state.router.experiments_pending
    key = (("list",), versions, pending, state.series.samples, who["admin"])
    if (answer := _cached(state, key)) is not None:
        return answer
    rows = []
    for name, experiment in state.router.experiments.items():
        latest = state.series.latest.get(name)
        arms = []
        for arm in experiment.describe():
            figures = latest.arms.get(arm["name"], {}) if latest else {}
            versus = figures.get("vs_control") or {}
            arms.append(
                {
                    **_arm_fields(arm),
                    "requests": figures.get("requests"),
                    "quality": versus.get("quality"),
                    "speed": versus.get("speed"),
                }
            )
        rows.append(
            {
                "name": name,
                "version": state.experiments.version(name),
                **experiment.comparison(),
                "arms": arms,
            }
        )
    return _keep(
        state, key, _json({"experiments": rows, "pending": pending, "viewer": who, **_sampler_facts(state)})
    )


@router.get("/ui/api/experiments/{name}")
async def ui_experiment_state(request: Request, name: str) -> Response:
    """One experiment as the page shows it (see the module's docstring)."""
    who = viewer(request)
    state = request.app.state
    experiment = state.router.experiments.get(name)
    if experiment is None:
        raise GatewayError(404, f"no experiment named '{name}' is routed here", code="experiment_not_found")
    version = state.experiments.version(name)
    key = (("experiment", name), version, id(experiment), state.series.samples, who["admin"])
    if (answer := _cached(state, key)) is not None:
        return answer
    # Read in one go, without an await between them: the spec and the version the page writes against match.
    body = {
        "name": name,
        "version": version,
        "spec": spec_json(experiment.spec),
        **experiment.comparison(),
        "arms": [_arm_fields(arm, state.router.variants) for arm in experiment.describe()],
        "viewer": who,
        **_sampler_facts(state),
    }
    latest = state.series.latest.get(name)
    body["figures"] = None if latest is None else {"time": latest.time, "arms": latest.arms}
    body["peers"] = None if latest is None else latest.peers
    judge_against_ideal(body["arms"], latest.arms if latest else {})
    body.update(await _history(state, name, version))
    return _keep(state, key, _json(body))


@router.get("/ui/api/experiments/{name}/series")
async def ui_experiment_series(request: Request, name: str, after: int = -1) -> Response:
    """The sampled points of ``name`` after point ``after`` (all by default), oldest first."""
    viewer(request)
    state = request.app.state
    series = state.series.series.get(name)
    if series is None and name not in state.router.experiments:
        raise GatewayError(404, f"no experiment named '{name}' is routed here", code="experiment_not_found")
    points = [] if series is None else series.after(after)
    return _json(
        {
            "fields": list(FIELDS),
            "started": series.started if series else None,
            "stride": series.stride if series else 1,
            "points": [point.json() for point in points],
            **_sampler_facts(state),
        }
    )


def _sampler_facts(state) -> dict[str, Any]:
    series = state.series
    return {"interval_s": series.interval_s, "max_points": series.max_points, "samples": series.samples}


def judge_against_ideal(arms: list[dict[str, Any]], figures: dict[str, dict]) -> None:
    """Each arm's ``ideal_tpot_ratio`` (its kept blocks over the control's: the most depth pruning can give)
    and ``beyond_ideal``, whether its latest TPOT ratio lies wholly below it, as ``experiments report`` says
    them: the page marks such a ratio an artefact until explained, never a gain."""
    control = next((arm for arm in arms if arm["control"]), {})
    for arm in arms:
        versus = (figures.get(arm["name"]) or {}).get("vs_control") or {}
        arm.update(
            {"ideal_tpot_ratio": None, "beyond_ideal": False}
            if arm["control"]
            else against_ideal(arm, control, versus)
        )


def _arm_fields(arm: dict, variants: dict | None = None) -> dict[str, Any]:
    """An arm of :meth:`Experiment.describe`, with its variant's removed blocks when ``variants`` is given."""
    fields = {key: arm[key] for key in ("name", "variant", "objective", "weight", "share", "control")}
    if variants is not None:
        metadata = variants.get(arm["variant"])
        fields["removed_blocks"] = list(metadata.removed_blocks) if metadata else []
        fields["num_blocks"] = metadata.num_blocks if metadata else None
    return fields


async def _history(state, name: str, version: int | None) -> dict[str, Any]:
    """The newest :data:`HISTORY_SHOWN` changes and the guardrail stops, read from the store once per version
    (the page asks every second; the history only grows with a new version)."""
    cached = state.ui_history.get(name)
    if cached is not None and cached[0] == version:
        return cached[1]
    try:
        changes = await state.experiments.history(name)
    except StoreUnavailable as error:
        return {"history": [], "history_total": None, "history_error": str(error), "guardrail": {}}
    entries = [
        {
            "version": change.version,
            "changed_at": change.changed_at.timestamp(),
            "changed_at_iso": change.changed_at.isoformat(),
            "actor": change.actor,
            "action": change.action,
            "reason": change.reason,
            "what": change_summary(change.old_spec, change.new_spec),
        }
        for change in changes[-HISTORY_SHOWN:]
    ]
    result = {
        "history": entries,
        "history_total": len(changes),
        "history_error": None,
        "guardrail": guardrail_stops(changes),
    }
    if len(state.ui_history) > 256:  # deleted experiments' entries go at some point
        state.ui_history.clear()
    state.ui_history[name] = (version, result)
    return result


def change_summary(old: dict | None, new: dict | None) -> str:
    """What a change did, in words: ``twin weight 1 -> 0; margin 0.05 -> 0.1``."""
    if new is None:
        return "deleted"
    if old is None:
        arms = ", ".join(
            f"{arm.get('name')} ({_short(arm.get('weight', 1.0))})" for arm in new.get("arms", [])
        )
        return f"created with arms {arms}"
    parts = []
    before = {arm.get("name"): arm for arm in old.get("arms", [])}
    after = {arm.get("name"): arm for arm in new.get("arms", [])}
    for arm_name, arm in after.items():
        if arm_name not in before:
            parts.append(f"arm {arm_name} added (weight {_short(arm.get('weight', 1.0))})")
        elif arm.get("weight") != before[arm_name].get("weight"):
            parts.append(
                f"{arm_name} weight {_short(before[arm_name].get('weight'))} -> {_short(arm.get('weight'))}"
            )
        elif arm != before[arm_name]:
            parts.append(f"arm {arm_name} changed")
    parts += [f"arm {arm_name} removed" for arm_name in before if arm_name not in after]
    for key in sorted((set(old) | set(new)) - {"arms"}):
        if old.get(key) != new.get(key):
            parts.append(f"{key} {_short(old.get(key))} -> {_short(new.get(key))}")
    return "; ".join(parts) or "no change"


def _short(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
