"""The testing kit (as ``optuna.testing``): what the tests and benchmarks build on, importable from anywhere.

Nothing here downloads, and nothing is imported until its module is (the package itself is empty), so a
test that needs only ports does not load torch. The modules:

* :mod:`~depthprune.testing.models` — tiny random models of every supported architecture (6 blocks,
  hidden 64), built in memory or saved with a word-level tokenizer over ``w4`` ... ``w255``;
* :mod:`~depthprune.testing.data` — random texts and multiple-choice questions in that vocabulary,
  JSON-lines files, and demo-like model folders (a tiny model carrying ``data/<name>.jsonl``);
* :mod:`~depthprune.testing.objectives` — synthetic subset objectives (additive costs plus pairwise
  interactions, with gradients and Block Influence) on which every search runs in microseconds;
* :mod:`~depthprune.testing.variants` — an example base model and pruned variant registered in a given
  registry, and a fake checkpoint directory the weights checksum accepts;
* :mod:`~depthprune.testing.servers` — ``free_port``; starting a server with its log, waiting until it
  answers (or until any condition holds), stopping its process group; ``running`` (a server for the length
  of a ``with`` block) and ``running_gateway`` (``depthprune serve`` likewise, with its JSON summary);
  the vLLM server's command line;
* :mod:`~depthprune.testing.fake_vllm` — a fake vLLM OpenAI server (same command line and routes), in a thread
  or as a process;
* :mod:`~depthprune.testing.gateways` — gateway replicas (``create_app`` in a thread) over fake backends, on
  a shared registry or none;
* :mod:`~depthprune.testing.generation` — greedy generation for parity tests: transformers in-process (with
  the logit gap of each step, to tell near-ties), the real vLLM engine in a separate process;
* :mod:`~depthprune.testing.vllm_greedy` — that separate process (``python -m``), one engine per checkpoint;
* :mod:`~depthprune.testing.schema_fuzz` — a bounded schemathesis run against a gateway's OpenAPI schema, in a
  process of its own (``python -m``);
* :mod:`~depthprune.testing.postgres` — a throwaway PostgreSQL server, and databases created and dropped on
  any server;
* :mod:`~depthprune.testing.cli` — ``run_cli``: the console script in-process, output captured;
* :mod:`~depthprune.testing.public_configs` — the public config.json of Llama-3.1-8B/70B, Qwen3-8B and
  Gemma-3-12B (no weights), for the memory planner;
* :mod:`~depthprune.testing.processes` — small jobs for one-process-per-job tests (hold memory, fail, RSS);
* :mod:`~depthprune.testing.imports` — which heavy modules (torch, vLLM, transformers) an import loads, seen
  from a fresh interpreter.
"""
