"""Gateway replicas in threads over fake vLLM backends, for the experiment and fault tests::

    with fake_backends("dense", "twin") as backends, gateway_replica(backends, "sqlite:///r.db") as url:
        httpx.post(f"{url}/v1/completions", json={"model": "dense", "prompt": "w3"})

A replica is :func:`server.create_app` served by uvicorn in a thread; every replica on one registry URL shares
its experiments, as ``depthprune serve`` processes do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port

ADMIN_TOKEN = "admin-secret"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
"""The headers of an admin request to a :func:`gateway_replica`."""


@contextmanager
def fake_backends(*names: str) -> Iterator[dict[str, str]]:
    """A fake vLLM server per name, in threads: ``{name: base URL}`` for the block's length."""
    servers = {name: serve_in_thread(create_fake_app(name), free_port()) for name in names}
    try:
        yield {name: server.url for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


@contextmanager
def gateway_replica(
    backends: dict[str, str],
    registry_url: str | None,
    experiments: dict | None = None,
    port: int | None = None,
    **settings: Any,
) -> Iterator[str]:
    """One gateway replica on ``registry_url`` (None: experiments in its process), in a thread, until the
    block ends; it yields its base URL.

    Args:
        backends: ``{variant: URL}``, e.g. from :func:`fake_backends`.
        registry_url: the registry whose experiments it shares.
        experiments: the config file's experiments.
        port: its port (a free one by default; give the same to restart "the same" replica).
        settings: other :class:`server.GatewaySettings` fields (the poll is 0.2 s and the admin token
            :data:`ADMIN_TOKEN` unless given).
    """
    from server import BackendSpec, GatewaySettings, create_app

    config = GatewaySettings(
        backends=[BackendSpec(name, url=url) for name, url in backends.items()],
        experiments=experiments or {},
        experiments_registry=registry_url,
        **{"experiments_poll_s": 0.2, "admin_token": ADMIN_TOKEN, **settings},
    )
    server = serve_in_thread(create_app(config), port or free_port())
    try:
        yield server.url
    finally:
        server.stop()
