"""The embedded demo model: a small Llama trained from scratch here, because no weights can be downloaded.

:func:`ensure_demo_model` generates a corpus (:mod:`ground.demo.corpus`), trains a byte-level BPE
tokenizer on it, trains a ``LlamaForCausalLM`` deterministically (fixed seed, fixed data order), measures
it against a unigram baseline and chance, and writes an ordinary Hugging Face checkpoint plus the held-out
data the other commands use::

    demo-<recipe hash>/
      config.json, generation_config.json, model.safetensors      (float32)
      tokenizer.json, tokenizer_config.json, chat_template.jinja  (AutoTokenizer and vLLM load them)
      recipe.json        the recipe, its hash, library versions
      quality.json       held-out perplexity vs unigram, QA accuracy vs chance, training time
      data/train.jsonl             {"text"}: every training document
      data/text_calibration.jsonl  {"text"}: flowing text (the C4/WikiText stand-in)
      data/text_test.jsonl         {"text"}
      data/qa_calibration.jsonl    {"context", "choices", "label"} (the Commonsense-170k stand-in)
      data/qa_test.jsonl           {"context", "choices", "label"}

The directory is keyed by a hash of the recipe (and of this module's format version), built in a
temporary sibling and renamed into place, so an interrupted build never leaves a half-written entry.

Run ``depthprune demo-model`` (default recipe, a few minutes on 2 cores) or
``depthprune demo-model --recipe tiny`` (seconds; what the tests use).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from ground.core.errors import UserError
from ground.core.files import exclusive_lock, lock_beside
from ground.demo.paths import DATA_FILES, data_file, default_demo_dir
from ground.demo.recipe import FORMAT_VERSION, DemoRecipe

# Steps between re-reading the load average to choose the thread count.
THREAD_CHECK_STEPS = 20

SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

# Shows a chat as the QA format the model was trained on, so /v1/chat/completions gives sensible answers.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}Question: {{ message['content'] }}\nAnswer:"
    "{% elif message['role'] == 'assistant' %} {{ message['content'] }}\n"
    "{% else %}{{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
)


def is_demo_model(directory: Path, recipe: DemoRecipe) -> bool:
    """Whether ``directory`` is a complete demo model built from ``recipe``."""
    try:
        meta = json.loads((directory / "recipe.json").read_text())
    except (OSError, ValueError):
        return False
    required = ("model.safetensors", "quality.json", "tokenizer.json")
    complete = all((directory / name).is_file() for name in required)
    return complete and meta.get("recipe_hash") == recipe.hash()


def read_quality(directory: Path) -> dict:
    """The ``quality.json`` of a built demo model."""
    return json.loads((Path(directory) / "quality.json").read_text())


def ensure_demo_model(
    recipe: DemoRecipe | None = None, out: Path | None = None, progress: bool = True, force: bool = False
) -> Path:
    """Build the demo model, or reuse the cached one built from the same recipe.

    Args:
        recipe: what to build; ``DemoRecipe()`` when None.
        out: directory to build into; ``default_demo_dir(recipe)`` when None.
        progress: show a progress bar while training.
        force: rebuild even when ``out`` already holds this recipe's model, and replace a demo model of
            another recipe there.

    Returns:
        The model directory.

    Raises:
        UserError: ``out`` exists and is not a demo model (never deleted), or holds another recipe's model and
            ``force`` is not set.
    """
    recipe = recipe or DemoRecipe()
    target = Path(out).expanduser().resolve() if out is not None else default_demo_dir(recipe)
    _check_target(target, recipe, force)
    if target.exists() and is_demo_model(target, recipe) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(lock_beside(target)):
        # Another process may have finished the same build while this one waited for the lock.
        if is_demo_model(target, recipe) and not force:
            return target
        # Builds run under the lock, so any staging directory left here is from a killed build.
        for stale in target.parent.glob(f".{target.name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = target.parent / f".{target.name}.building-{os.getpid()}"
        try:
            build_demo_model(recipe, staging, progress=progress)
            _replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _check_target(target: Path, recipe: DemoRecipe, force: bool) -> None:
    if not target.exists():
        return
    if not target.is_dir():
        raise UserError(f"{target} exists and is not a directory")
    if is_demo_model(target, recipe):
        return
    if not any(target.iterdir()):
        return
    if not (target / "recipe.json").is_file():
        raise UserError(f"{target} exists and is not a demo model directory; choose another --out")
    if not force:
        raise UserError(f"{target} holds a demo model of another recipe; pass --force to replace it")


def _replace(staging: Path, target: Path) -> None:
    """Move a finished build into place; an old entry is moved aside first and deleted after."""
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.rename(target, old)
    os.rename(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_demo_model(recipe: DemoRecipe, directory: Path, progress: bool = True) -> dict:
    """Generate the corpus, train tokenizer and model, measure them and write everything to ``directory``.

    Args:
        recipe: what to build.
        directory: an empty or missing directory (the caller renames it into the cache).
        progress: show a progress bar while training.

    Returns:
        The quality record also written to ``quality.json``.
    """
    import torch
    import transformers

    from ground.demo.corpus import generate_corpus

    directory.mkdir(parents=True, exist_ok=True)
    corpus = generate_corpus(
        recipe.seed,
        recipe.num_residents,
        recipe.train_text_documents,
        recipe.train_qa_documents,
        recipe.held_out_text,
        recipe.held_out_qa,
    )
    _write_data(directory / "data", corpus)
    tokenizer = train_tokenizer(corpus.train, recipe)
    tokenizer.save_pretrained(directory)
    stream = token_stream(tokenizer, corpus.train)

    with _torch_threads():
        model, training = train_model(recipe, tokenizer, stream, progress=progress)
        model.save_pretrained(directory)
        model.eval()
        unigram = unigram_log_probs(stream, len(tokenizer), tokenizer.bos_token_id)
        text = perplexities(model, tokenizer, corpus.text_test, unigram, recipe.max_position_embeddings)
        qa = qa_accuracy(model, tokenizer, corpus.qa_test)
    quality = {
        **text,
        "perplexity_ratio": text["perplexity"] / text["unigram_perplexity"],
        **qa,
        **training,
        "acceptance": {
            "perplexity_below_third_of_unigram": text["perplexity"] < text["unigram_perplexity"] / 3,
            "qa_accuracy_at_least_twice_chance": qa["qa_accuracy"] >= 2 * qa["qa_chance"],
        },
    }
    (directory / "quality.json").write_text(json.dumps(quality, indent=2) + "\n")
    meta = {
        "recipe_hash": recipe.hash(),
        "format_version": FORMAT_VERSION,
        "recipe": asdict(recipe),
        "data": {name: str(data_file(Path("."), name)) for name in DATA_FILES},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (directory / "recipe.json").write_text(json.dumps(meta, indent=2) + "\n")
    (directory / "README.md").write_text(_model_card(recipe, quality))
    return quality


@contextlib.contextmanager
def _torch_threads():
    """Restore torch's thread count after training changed it (see :func:`adaptive_threads`)."""
    import torch

    previous = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _write_data(data_dir: Path, corpus) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = {
        "train": [{"text": text} for text in corpus.train],
        "text_calibration": [{"text": text} for text in corpus.text_calibration],
        "text_test": [{"text": text} for text in corpus.text_test],
        "qa_calibration": corpus.qa_calibration,
        "qa_test": corpus.qa_test,
    }
    for name, lines in rows.items():
        with data_file(data_dir.parent, name).open("w") as handle:
            for row in lines:
                handle.write(json.dumps(row) + "\n")


def train_tokenizer(documents: list[str], recipe: DemoRecipe):
    """A byte-level BPE tokenizer trained on ``documents``, wrapped for transformers.

    Byte-level means any text encodes without ``<unk>``; the post-processor prepends ``<s>`` as Llama's does.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [SPECIAL_TOKENS[key] for key in ("unk_token", "bos_token", "eos_token", "pad_token")]
    backend = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(documents, trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=recipe.max_position_embeddings, **SPECIAL_TOKENS
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def token_stream(tokenizer, documents: list[str]):
    """All documents as one id tensor, each as ``<s> text </s>``, in corpus order (packed for training)."""
    import torch

    # The backend encodes in parallel and does not warn about documents longer than the model's context.
    encoded = tokenizer.backend_tokenizer.encode_batch(documents, add_special_tokens=False)
    ids: list[int] = []
    for document in encoded:
        ids.append(tokenizer.bos_token_id)
        ids.extend(document.ids)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def model_config(recipe: DemoRecipe, tokenizer):
    """The ``LlamaConfig`` of the recipe for this tokenizer."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def train_model(recipe: DemoRecipe, tokenizer, stream, progress: bool = True):
    """Train a Llama from scratch on the packed token stream, deterministically in ``recipe.seed``.

    Returns:
        ``(model, stats)`` with the model in float32 and stats ``train_seconds``, ``train_tokens``,
        ``tokens_per_second``, ``final_loss`` (mean of the last 20 steps), ``threads`` (counts used) and the
        machine's load average before and after (the machines are shared; timings mean little without it).
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import GenerationConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(model_config(recipe, tokenizer)).float()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_length=recipe.max_position_embeddings,
    )
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.learning_rate,
        betas=(0.9, 0.95),
    )

    def learning_rate(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        progress_share = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_share))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate)
    sequences = stream[: len(stream) // recipe.seq_len * recipe.seq_len].view(-1, recipe.seq_len)
    if len(sequences) < recipe.batch_size:
        raise ValueError("the corpus is smaller than one batch; add documents or lower batch_size")
    order = _batch_order(len(sequences), recipe)

    model.train()
    losses: list[float] = []
    load_before = os.getloadavg()
    started = time.perf_counter()
    bar = tqdm(
        range(recipe.steps), desc="training demo model", unit="step", disable=not progress, leave=False
    )
    threads_used = set()
    for step in bar:
        if step % THREAD_CHECK_STEPS == 0:
            torch.set_num_threads(adaptive_threads(torch.get_num_threads()))
            threads_used.add(torch.get_num_threads())
        batch = sequences[order[step]]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16_autocast):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    seconds = time.perf_counter() - started
    bar.close()
    stats = {
        "train_seconds": round(seconds, 1),
        "train_tokens": recipe.train_tokens,
        "tokens_per_second": round(recipe.train_tokens / seconds, 1),
        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "threads": sorted(threads_used),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    return model, stats


def adaptive_threads(current: int) -> int:
    """CPU threads to train with now: the cores that other processes leave free, at least one.

    On a shared machine a second thread that is often descheduled stalls every parallel region (measured
    here: a 16-block model trained at 100 tokens/s on two threads against 400 on one, at load 10). Thread
    count does not change the result (same weights on 1 and 2 threads), so choosing it at run time keeps
    builds deterministic.
    """
    cores = os.cpu_count() or 1
    others = os.getloadavg()[0] - current
    return max(1, min(cores, round(cores - others)))


def _batch_order(num_sequences: int, recipe: DemoRecipe):
    """Sequence indices of every step: seeded permutations, one per epoch, cut into batches."""
    import torch

    generator = torch.Generator().manual_seed(recipe.seed)
    needed = recipe.steps * recipe.batch_size
    epochs = []
    while sum(len(e) for e in epochs) < needed:
        epochs.append(torch.randperm(num_sequences, generator=generator))
    return torch.cat(epochs)[:needed].view(recipe.steps, recipe.batch_size)


def unigram_log_probs(stream, vocab_size: int, bos_token_id: int):
    """Log-probabilities of an add-one-smoothed unigram model counted on the training stream.

    ``<s>`` is not counted: it is never predicted.
    """
    import torch

    counts = torch.bincount(stream[stream != bos_token_id], minlength=vocab_size).double()
    return torch.log((counts + 1) / (counts.sum() + vocab_size))


def perplexities(model, tokenizer, texts: list[str], unigram, max_length: int, batch_size: int = 16) -> dict:
    """Token-level perplexity of the model and of the unigram baseline on the same tokens.

    Each text is scored as ``<s> text`` (truncated to ``max_length``); every token after ``<s>`` is predicted.
    """
    import torch

    total_nll = 0.0
    total_unigram = 0.0
    count = 0
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            encoded = [
                tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
                for text in texts[start : start + batch_size]
            ]
            ids, mask = _pad(encoded, tokenizer.pad_token_id)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
            targets = ids[:, 1:]
            target_mask = mask[:, 1:].bool()
            token_log_probs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            total_nll -= token_log_probs[target_mask].double().sum().item()
            total_unigram -= unigram[targets[target_mask]].sum().item()
            count += int(target_mask.sum())
    return {
        "perplexity": math.exp(total_nll / count),
        "unigram_perplexity": math.exp(total_unigram / count),
        "text_tokens": count,
    }


def answer_log_probs(model, tokenizer, requests: list[tuple[str, str]], batch_size: int = 64) -> list[float]:
    """Mean log-probability of each answer's tokens after ``"Question: {context}\\nAnswer:"``.

    Args:
        model: causal LM in eval mode.
        tokenizer: its tokenizer (prepends ``<s>``).
        requests: ``(context, choice)`` pairs; the continuation is ``" {choice}"``, split off the way lm-eval
            does: encode the prompt and the whole string, and take the tokens of the whole string past the
            prompt's.
        batch_size: sequences per forward.

    Returns:
        One score per request, in order.
    """
    import torch

    sequences, spans = [], []
    for context, choice in requests:
        prompt = f"Question: {context}\nAnswer:"
        full = tokenizer(f"{prompt} {choice}")["input_ids"]
        sequences.append(full)
        spans.append((len(tokenizer(prompt)["input_ids"]), len(full)))
    scores = []
    with torch.no_grad():
        for start in range(0, len(sequences), batch_size):
            ids, mask = _pad(sequences[start : start + batch_size], tokenizer.pad_token_id)
            log_probs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
            for row, (begin, end) in enumerate(spans[start : start + batch_size]):
                positions = torch.arange(begin, end)
                scores.append(log_probs[row, positions - 1, ids[row, positions]].mean().item())
    return scores


def qa_accuracy(model, tokenizer, items: list[dict]) -> dict:
    """Accuracy of picking the choice with the highest mean answer-token log-probability, and chance."""
    requests = [(item["context"], choice) for item in items for choice in item["choices"]]
    scores = iter(answer_log_probs(model, tokenizer, requests))
    correct = 0
    for item in items:
        item_scores = [next(scores) for _ in item["choices"]]
        correct += int(max(range(len(item_scores)), key=item_scores.__getitem__) == item["label"])
    return {
        "qa_accuracy": correct / len(items),
        "qa_chance": sum(1 / len(item["choices"]) for item in items) / len(items),
        "qa_items": len(items),
    }


def _pad(sequences: list[list[int]], pad_id: int):
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
    return ids, mask


def _model_card(recipe: DemoRecipe, quality: dict) -> str:
    return (
        "---\nlicense: apache-2.0\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n"
        f"# depthprune demo model ({recipe.hash()})\n\n"
        f"A {recipe.num_layers}-block Llama (hidden {recipe.hidden_size}) trained from scratch by "
        "`depthprune demo-model` on a generated corpus (no downloaded data). "
        "Held-out splits are in `data/`.\n\n"
        f"- held-out perplexity {quality['perplexity']:.2f} vs unigram {quality['unigram_perplexity']:.2f}\n"
        f"- QA accuracy {quality['qa_accuracy']:.3f} vs chance {quality['qa_chance']:.3f} "
        f"({quality['qa_items']} items)\n"
        f"- trained on {quality['train_tokens']:,} tokens in {quality['train_seconds']:.0f} s\n"
    )
