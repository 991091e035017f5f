"""Fixed-seed benchmark prompts: the demo model's test text, Python's documentation, a file, or synthetic.

Prompts are cut to ``input_len`` tokens with the best tokenizer available, in this order: a local
model directory (``AutoTokenizer``), the server's ``/tokenize`` + ``/detokenize`` endpoints (vLLM has
them), else an approximation of one token per whitespace-separated word, which the result records as
``tokenizer: "approximate (1 token per word)"``. Whatever the client estimates, the token counts in the
results come from the server's ``usage`` field.

A ``tag`` starts every prompt with a short label of its own (``r3.a1.17:``) before the cut: the load test
gives every arm and round its own tag, so no two requests share a first KV block and no arm is served from
the prefix cache another arm filled (two names of one engine share one cache).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from ground.core.errors import UserError
from ground.demo.paths import built_data_file

# Common English words for synthetic prompts when the tokenizer's own vocabulary is not at hand.
ENGLISH_WORDS = (
    "the of and to in is was for that on as with by he at from his it an were are which this be or "
    "had not but first one their its new after who they have her she two been other when there all "
    "during into school time may years more most only over city some world would where later up such "
    "used many can state about national out known university united then made also team between "
    "river north south east west house water music game film book power light small great long old"
).split()


class Tokenizer(Protocol):
    """What prompt building needs from a tokenizer."""

    description: str

    def tokenize(self, text: str) -> list:
        """Tokens of ``text`` (ids or strings), without special tokens."""

    def detokenize(self, tokens: Sequence) -> str:
        """Text of ``tokens``."""

    def vocabulary_words(self, count: int, seed: int) -> list[str]:
        """Up to ``count`` strings that are single tokens, for synthetic prompts."""


class HFTokenizer:
    """A transformers tokenizer loaded from a local model directory."""

    def __init__(self, directory: str | Path):
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.description = f"transformers AutoTokenizer ({directory})"

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._tokenizer.decode(list(tokens), skip_special_tokens=True)

    def vocabulary_words(self, count: int, seed: int) -> list[str]:
        special = set(self._tokenizer.all_special_ids)
        ids = [i for i in range(len(self._tokenizer)) if i not in special]
        random.Random(seed).shuffle(ids)
        words = [self._tokenizer.decode([i]).strip() for i in ids[: count * 2]]
        return [word for word in words if word and word.isprintable()][:count]


class ServerTokenizer:
    """vLLM's ``/tokenize`` and ``/detokenize`` endpoints of the target."""

    def __init__(self, target: str, model: str, headers: dict | None = None):
        self._target, self._model, self._headers = target.rstrip("/"), model, headers or {}
        self.description = f"server /tokenize of {model}"

    def _post(self, path: str, body: dict) -> dict:
        response = httpx.post(
            self._target + path, json={"model": self._model, **body}, headers=self._headers, timeout=30.0
        )
        response.raise_for_status()
        return response.json()

    def tokenize(self, text: str) -> list[int]:
        return list(self._post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self._post("/detokenize", {"tokens": list(tokens)})["prompt"])

    def vocabulary_words(self, count: int, seed: int) -> list[str]:
        return list(ENGLISH_WORDS)

    @classmethod
    def probe(cls, target: str, model: str, headers: dict | None = None) -> ServerTokenizer | None:
        """The server tokenizer when the target answers ``/tokenize`` for ``model``, else None."""
        tokenizer = cls(target, model, headers)
        try:
            tokens = tokenizer.tokenize("hello world")
            tokenizer.detokenize(tokens)
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            return None
        return tokenizer


class WordTokenizer:
    """The fallback: one token per whitespace-separated word (an approximation, said so in results)."""

    description = "approximate (1 token per word)"

    def tokenize(self, text: str) -> list[str]:
        return text.split()

    def detokenize(self, tokens: Sequence[str]) -> str:
        return " ".join(tokens)

    def vocabulary_words(self, count: int, seed: int) -> list[str]:
        return list(ENGLISH_WORDS)


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt."""

    text: str
    """The prompt text sent to the server."""
    estimated_len: int
    """Its length in tokens by the client's tokenizer (the server's count replaces it in results)."""


def read_texts(path: str | Path) -> list[str]:
    """Prompt texts of a file: JSON Lines with a ``prompt`` or ``text`` field, else one prompt per line.

    Raises:
        UserError: when the file is missing or holds no text.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist")
    texts: list[str] = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if path.suffix in (".jsonl", ".json") and line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path}:{number} is not valid JSON") from None
            text = record.get("prompt") or record.get("text")
            if not isinstance(text, str):
                raise UserError(f"{path}:{number} has no string 'prompt' or 'text' field")
            line = text.strip()
        if line:
            texts.append(line)
    if not texts:
        raise UserError(f"prompt file {path} holds no prompts")
    return texts


def demo_data_file() -> Path:
    """The demo model's held-out text (``text_test``); UserError when the demo model was not built yet."""
    try:
        return built_data_file("text_test")
    except UserError as error:
        raise UserError(f"{error} or pass --prompts FILE or --prompts synthetic") from None


def pydoc_texts() -> list[str]:
    """The paragraphs of CPython's pydoc topics (``pydoc_data.topics``): real English text that ships with
    Python, so ``--prompts pydoc`` works offline."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise UserError("--prompts pydoc needs pydoc_data, which this Python lacks; pass a file") from None
    paragraphs = (part.strip() for name in sorted(topics) for part in topics[name].split("\n\n"))
    return [" ".join(paragraph.split()) for paragraph in paragraphs if len(paragraph.split()) >= 20]


PROMPT_SOURCES = ("synthetic", "pydoc", "demo")
"""``--prompts`` values that are not files."""


def source_texts(source: str) -> list[str]:
    """The texts of ``pydoc``, ``demo`` or a file (see :func:`read_texts`)."""
    if source == "pydoc":
        return pydoc_texts()
    return read_texts(demo_data_file() if source == "demo" else source)


def build_prompts(
    source: str,
    count: int,
    input_len: int,
    tokenizer: Tokenizer,
    seed: int = 0,
    tag: str = "",
) -> list[Prompt]:
    """``count`` prompts of at most ``input_len`` tokens (exactly, for synthetic ones), fixed by ``seed``.

    Args:
        source: ``synthetic``, ``pydoc``, ``demo``, or a path (JSON Lines or one prompt per line).
        count: How many prompts (texts are reused in shuffled order when the source has fewer).
        input_len: Token length of synthetic prompts and the cut for texts.
        tokenizer: Counts and cuts tokens.
        seed: Fixes choice and order.
        tag: When given, prompt ``i`` starts with ``{tag}.{i}:`` (inside the ``input_len`` tokens), which
            keeps prompts of different tags out of each other's prefix cache.

    Returns:
        The prompts, in sending order.
    """
    if count < 1:
        raise UserError("the number of prompts must be at least 1")
    if input_len < 1:
        raise UserError("--input-len must be at least 1")
    rng = random.Random(seed)
    labels = [f"{tag}.{index}: " if tag else "" for index in range(count)]
    if source == "synthetic":
        words = tokenizer.vocabulary_words(512, seed) or list(ENGLISH_WORDS)
        return [_synthetic_prompt(tokenizer, input_len, rng, words, label) for label in labels]
    texts = source_texts(source)
    order: list[str] = []
    while len(order) < count:
        block = list(texts)
        rng.shuffle(block)
        order.extend(block)
    prompts = []
    for label, text in zip(labels, order[:count]):
        text = label + text
        tokens = tokenizer.tokenize(text)
        if len(tokens) > input_len:
            tokens = tokens[:input_len]
            text = tokenizer.detokenize(tokens)
        prompts.append(Prompt(text=text, estimated_len=len(tokens)))
    return prompts


def _synthetic_prompt(
    tokenizer: Tokenizer, input_len: int, rng: random.Random, words: Sequence[str], label: str = ""
) -> Prompt:
    # Twice as many words as tokens needed, then cut at the token level: words may be several tokens.
    text = label + " ".join(rng.choice(words) for _ in range(input_len * 2))
    tokens = tokenizer.tokenize(text)[:input_len]
    text = tokenizer.detokenize(tokens)
    return Prompt(text=text, estimated_len=len(tokens))
