"""The testing kit (as ``optuna.testing``): what the tests and benchmarks build on, importable from anywhere.

* :mod:`~depthprune.testing.models` — tiny random models of every supported architecture, saved with a
  word-level tokenizer;
* :mod:`~depthprune.testing.fake_vllm` — a fake vLLM OpenAI server (same command line and routes), in a thread
  or as a process;
* :mod:`~depthprune.testing.vllm_greedy` — greedy tokens from the real vLLM engine, in a separate process;
* :mod:`~depthprune.testing.postgres` — a throwaway PostgreSQL server;
* :mod:`~depthprune.testing.servers` — free ports, starting a server and waiting until it answers;
* :mod:`~depthprune.testing.cli` — ``run_cli``: the console script in-process, output captured.
"""
