"""``depthprune serve``: help, registry resolution with checksum verification, one-line errors before
anything starts, and a real run of the command against a remote (fake) backend.

Run: ``.venv/bin/python -m pytest tests/test_server_cli.py -q``
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from depthprune.cli import main
from depthprune.errors import UserError
from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from server.backends import free_port
from server.cli import parse_variant_list, resolve_backends


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_serve_help_explains_the_options(capsys):
    code, output = run_cli(["serve", "--help"], capsys)
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

    checkpoint = tmp_path / "variant"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    from depthprune.checksums import weights_sha256

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = open_registry(url)
    registry.register_base_model(
        "org/tiny-base",
        revision="abc",
        weights_sha256=hashlib.sha256(b"").hexdigest(),
        num_blocks=6,
        architecture="llama",
    )
    variant = registry.register_variant(
        base_model="org/tiny-base",
        removed_blocks=[1, 4],
        calibration={"objective": "perplexity", "data": "demo:text", "samples": 4, "seq_len": 32, "seed": 0},
        search="greedy",
        search_options={},
        calibration_loss=4.0,
        dense_loss=3.5,
        search_seconds=1.0,
        block_forwards=5,
        subset_evaluations=3,
        checkpoint_path=str(checkpoint),
        checkpoint_sha256=weights_sha256(checkpoint),
    )
    registry.set_alias("ppl-best", variant.name)
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


def test_changed_checkpoint_is_refused(registry_with_variant, capsys):
    url, checkpoint, _ = registry_with_variant
    (checkpoint / "model.safetensors").write_bytes(b"tampered")
    code, output = run_cli(
        ["serve", "--variants", "ppl-best", "--registry", url, "--port", str(free_port())], capsys
    )
    assert code == 2 and output.startswith("error: cannot serve 'ppl-best': ") and "was modified" in output


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
def test_mistakes_are_one_line_errors_before_anything_starts(tmp_path, capsys, args, config, message):
    if config is not None:
        (tmp_path / "gw.yaml").write_text(json.dumps(config))  # JSON is YAML
        args = [*args, "--config", str(tmp_path / "gw.yaml")]
    code, output = run_cli(["serve", *args, "--port", str(free_port())], capsys)
    assert code == 2 and output.startswith("error: ") and message in output, output


def test_port_in_use_is_reported(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, output = run_cli(["serve", "--variants", "a=http://127.0.0.1:9", "--port", str(port)], capsys)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in output


def test_serve_command_runs_a_gateway_until_interrupted(tmp_path):
    backend = serve_in_thread(create_fake_app("far"), free_port())
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text("experiments:\n  canary:\n    arms:\n      - variant: far\n        weight: 1\n")
    command = [
        sys.executable,
        "-m",
        "depthprune",
        "serve",
        "--variants",
        f"far={backend.url}",
        "--port",
        str(port),
        "--config",
        str(config),
        "--api-key",
        "k",
        "--json",
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DEPTHPRUNE_HOME": str(tmp_path)},
        cwd=Path(__file__).parent.parent,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, process.stderr.read()
        summary = json.loads(process.stdout.readline())
        assert summary["url"] == f"http://127.0.0.1:{port}" and summary["variants"]["far"]["up"]
        assert summary["experiments"] == ["canary"]
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.post(
                    f"{summary['url']}/v1/completions",
                    json={"model": "canary", "prompt": "w5"},
                    headers={"authorization": "Bearer k"},
                )
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert response.status_code == 200 and response.headers["x-depthprune-variant"] == "far"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        backend.stop()


def test_broken_config_files_are_one_line_errors(tmp_path, capsys):
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
        code, output = run_cli(
            ["serve", "--config", str(tmp_path / name), "--port", str(free_port())], capsys
        )
        assert code == 2 and output.startswith("error: ") and message in output, output
    code, output = run_cli(["serve", "--config", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "does not exist" in output
