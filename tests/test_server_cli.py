"""``depthprune serve``: help, registry resolution with checksum verification, one-line errors before
anything starts, and a real run of the command against a remote (fake) backend.

Run: ``.venv/bin/python -m pytest tests/test_server_cli.py -q``
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port, running_gateway
from depthprune.testing.variants import fake_checkpoint, register_example_base, register_example_variant
from ground.core.errors import UserError
from server.cli import parse_variant_list, resolve_backends


def test_serve_help_explains_the_options():
    code, output, _ = run_cli("serve", "--help")
    assert code == 0
    for option in ("--variants", "--registry", "--config", "--admin-token", "--api-key", "--json", "--port"):
        assert option in output


def test_variant_list_parsing():
    assert parse_variant_list("dense, ppl-best,x=http://h:1") == [
        ("dense", None),
        ("ppl-best", None),
        ("x", "http://h:1"),
    ]
    for bad in ("", "dense,,x", " , "):
        with pytest.raises(UserError):
            parse_variant_list(bad)


@pytest.fixture()
def registry_with_variant(tmp_path):
    """A registry with a base model (hub id) and one pruned variant aliased ppl-best, checkpoint on disk."""
    from registry import open_registry

    checkpoint = fake_checkpoint(tmp_path / "variant")
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with open_registry(url) as registry:
        register_example_base(registry)
        variant = register_example_variant(registry, [1, 4], checkpoint=checkpoint, alias="ppl-best")
    return url, checkpoint, variant


def test_variants_resolve_through_the_registry(registry_with_variant):
    url, checkpoint, variant = registry_with_variant
    dense, pruned, remote = resolve_backends(
        [("dense", None), ("ppl-best", None), ("far", "http://10.0.0.1:8001")], url
    )
    assert dense.model_dir == "org/tiny-base" and dense.metadata.is_dense and dense.metadata.objective is None
    assert pruned.model_dir == str(checkpoint) and pruned.metadata.removed_blocks == [1, 4]
    assert pruned.metadata.objective == "perplexity" and variant.name in pruned.metadata.aliases
    assert remote.url == "http://10.0.0.1:8001" and not remote.managed


def test_changed_checkpoint_is_refused(registry_with_variant):
    url, checkpoint, _ = registry_with_variant
    (checkpoint / "model.safetensors").write_bytes(b"tampered")
    code, _, error = run_cli("serve", "--variants", "ppl-best", "--registry", url, "--port", free_port())
    assert code == 2 and error.startswith("error: cannot serve 'ppl-best': ") and "was modified" in error


@pytest.mark.parametrize(
    "args, config, message",
    [
        (["--variants", "a=ftp://x"], None, "is not an http(s)://host:port URL"),
        (["--variants", "nope-never-registered"], None, "nope-never-registered"),
        (["--variants", "a=http://127.0.0.1:9,a=http://127.0.0.1:10"], None, "variant listed twice: a"),
        (["--variants", "a=http://127.0.0.1:9"], {"colour": "blue"}, "unknown key(s) colour"),
        (
            ["--variants", "a=http://127.0.0.1:9"],
            {"experiments": {"ab": {"arms": [{"objective": "ppl"}]}}},
            "no served variant has calibration objective 'ppl'",
        ),
        (["--variants", "a=http://127.0.0.1:9", "--dtype", "int3"], None, "unknown dtype 'int3'"),
        ([], None, "no variants to serve"),
    ],
)
def test_mistakes_are_one_line_errors_before_anything_starts(tmp_path, args, config, message):
    if config is not None:
        (tmp_path / "gw.yaml").write_text(json.dumps(config))  # JSON is YAML
        args = [*args, "--config", str(tmp_path / "gw.yaml")]
    code, _, error = run_cli("serve", *args, "--port", free_port())
    assert code == 2 and error.startswith("error: ") and message in error, error


def test_port_in_use_is_reported():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, error = run_cli("serve", "--variants", "a=http://127.0.0.1:9", "--port", port)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in error


def test_serve_command_runs_a_gateway_until_interrupted(tmp_path):
    backend = serve_in_thread(create_fake_app("far"), free_port())
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "experiments:\n  canary:\n    control: far\n    arms:\n      - variant: far\n        weight: 1\n"
    )
    options = ("--config", str(config), "--api-key", "k", "--log-level", "warning")
    env = {"DEPTHPRUNE_HOME": str(tmp_path)}
    try:
        with running_gateway(
            f"far={backend.url}",
            tmp_path / "serve.log",
            *options,
            port=port,
            env=env,
            timeout_s=60,
            stop_timeout_s=30,
        ) as gateway:
            summary = gateway.summary
            assert summary["url"] == f"http://127.0.0.1:{port}" and summary["variants"]["far"]["up"]
            assert summary["experiments"] == ["canary"]
            response = httpx.post(
                f"{gateway.url}/v1/completions",
                json={"model": "canary", "prompt": "w5"},
                headers={"authorization": "Bearer k"},
            )
            assert response.status_code == 200 and response.headers["x-depthprune-variant"] == "far"
        # stopped as Ctrl-C stops it: cleanly, and with 130 as the docs say (issue 57: it was 0)
        assert gateway.process.returncode == 130
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        backend.stop()


def test_broken_config_files_are_one_line_errors(tmp_path):
    cases = {
        "bad.yaml": ("variants: [a=http://127.0.0.1:9\n", "is not valid yaml"),
        "list.yaml": ("- a\n- b\n", "must hold a mapping"),
        "arms.json": (
            json.dumps(
                {
                    "variants": ["a=http://127.0.0.1:9"],
                    "experiments": {"ab": {"arms": [{"variant": "a", "weight": -1}]}},
                }
            ),
            "experiment 'ab'",
        ),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        code, _, error = run_cli("serve", "--config", tmp_path / name, "--port", free_port())
        assert code == 2 and error.startswith("error: ") and message in error, error
    code, _, error = run_cli("serve", "--config", tmp_path / "missing.yaml")
    assert code == 2 and "does not exist" in error
