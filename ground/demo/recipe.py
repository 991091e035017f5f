"""The demo model's recipe: every setting that determines what ``depthprune demo-model`` builds.

Its hash names the cache entry (:func:`ground.demo.paths.default_demo_dir`), so a changed recipe builds
a new model instead of reusing a stale one. Pure Python: the data paths need it without torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

# Bump when the corpus generator, tokenizer or training loop changes what a recipe produces.
FORMAT_VERSION = 2


@dataclass(frozen=True)
class DemoRecipe:
    """Everything that determines the demo model; its hash names the cache entry."""

    seed: int = 0
    """Seed of the world, the corpus, the initial weights and the data order."""
    num_residents: int = 40
    """Named residents in the generated world (their facts are what the fact questions ask)."""
    train_text_documents: int = 5000
    """Flowing-text documents (one to three paragraphs each) in the training corpus."""
    train_qa_documents: int = 10000
    """``Question: ...\\nAnswer: ...`` lines in the training corpus."""
    held_out_text: int = 200
    """Lines in each of ``text_calibration`` and ``text_test``."""
    held_out_qa: int = 400
    """Items in each of ``qa_calibration`` and ``qa_test``."""
    vocab_size: int = 1024
    """Upper bound of the BPE vocabulary (the trainer stops earlier when the corpus has no more merges)."""
    num_layers: int = 16
    """Decoder blocks."""
    hidden_size: int = 256
    """Width of the residual stream."""
    intermediate_size: int = 512
    """Width of the MLP."""
    num_heads: int = 8
    """Attention heads; ``hidden_size / num_heads`` is the head dimension (vLLM's CPU engine needs >= 32)."""
    num_kv_heads: int = 4
    """Key/value heads (grouped-query attention as in Llama 3)."""
    max_position_embeddings: int = 512
    """Longest sequence the model accepts."""
    seq_len: int = 128
    """Tokens per training sequence (documents are packed)."""
    batch_size: int = 8
    """Sequences per optimizer step (small batches and more steps learn more from a small token budget)."""
    steps: int = 560
    """Optimizer steps; tokens trained on = steps * batch_size * seq_len."""
    learning_rate: float = 2e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to a tenth)."""
    warmup_steps: int = 30
    """Steps of linear warm-up."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (not on norms)."""
    bf16_autocast: bool = False
    """Train under bfloat16 autocast. Off by default: on CPUs without AVX-512 BF16/AMX (such as this project's
    AVX2 machines) a bfloat16 matmul is about 50 times slower than float32. Weights are stored in float32."""

    def __post_init__(self):
        positive = (
            "num_residents",
            "train_text_documents",
            "train_qa_documents",
            "held_out_text",
            "held_out_qa",
            "num_layers",
            "hidden_size",
            "intermediate_size",
            "num_heads",
            "num_kv_heads",
            "seq_len",
            "batch_size",
            "steps",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.hidden_size // self.num_heads < 32:
            raise ValueError(
                "head dimension (hidden_size / num_heads) must be at least 32 (vLLM's CPU engine needs it)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.seq_len > self.max_position_embeddings:
            raise ValueError("seq_len must not exceed max_position_embeddings")
        if self.vocab_size < 300:
            raise ValueError("vocab_size must be at least 300 (256 byte symbols, merges, special tokens)")
        if not 0 < self.learning_rate < 1:
            raise ValueError("learning_rate must be in (0, 1)")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError("warmup_steps must be in [0, steps)")

    @classmethod
    def tiny(cls) -> DemoRecipe:
        """A recipe that trains in seconds: 8 blocks of width 64 (two heads of 32), for tests."""
        return cls(
            num_residents=12,
            train_text_documents=500,
            train_qa_documents=500,
            held_out_text=24,
            held_out_qa=48,
            vocab_size=512,
            num_layers=8,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            num_kv_heads=1,
            max_position_embeddings=256,
            seq_len=64,
            batch_size=8,
            steps=60,
            learning_rate=4e-3,
            warmup_steps=6,
        )

    @property
    def train_tokens(self) -> int:
        """Tokens the model is trained on."""
        return self.steps * self.batch_size * self.seq_len

    def hash(self) -> str:
        """Short content hash of the recipe and the format version: the cache key."""
        payload = json.dumps({"recipe": asdict(self), "format_version": FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


RECIPES = {"default": DemoRecipe, "tiny": DemoRecipe.tiny}
