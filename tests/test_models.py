"""Block access: the composed forward equals the model's own, and skipping equals a shortened model."""

import copy

import pytest
import torch

from depthprune.testing.models import tiny_model
from ground.core.errors import UserError
from pruning.model.blocks import BlockStack, parse_block_list, validate_removed

ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "gemma3_text"]


def shortened_copy(model, removed):
    """The reference: a deep copy whose block list and per-layer config lists drop ``removed``."""
    short = copy.deepcopy(model)
    short.model.layers = torch.nn.ModuleList(
        [block for i, block in enumerate(short.model.layers) if i not in removed]
    )
    short.config.num_hidden_layers = len(short.model.layers)
    if getattr(short.config, "layer_types", None):
        short.config.layer_types = [t for i, t in enumerate(short.config.layer_types) if i not in removed]
    return short


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_dense_forward_equals_model(architecture):
    model = tiny_model(architecture)
    input_ids = torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids, use_cache=False).logits
    torch.testing.assert_close(BlockStack(model).forward(input_ids), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("removed", [{1, 4}, {0, 2, 5}, {3}])
def test_skipping_equals_shortened_model(architecture, removed):
    model = tiny_model(architecture)
    input_ids = torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = shortened_copy(model, removed)(input_ids, use_cache=False).logits
    torch.testing.assert_close(BlockStack(model).forward(input_ids, removed), expected, rtol=0, atol=1e-5)


def test_padding_mask_is_respected():
    model = tiny_model("llama")
    stack = BlockStack(model)
    input_ids = torch.randint(4, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    padded = torch.cat([input_ids, torch.full((1, 4), 3)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 4)], dim=1).long()
    torch.testing.assert_close(
        stack.forward(padded, {2}, mask)[:, :10], stack.forward(input_ids, {2}), rtol=0, atol=1e-5
    )


def test_unsupported_architecture_names_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(UserError, match="supported: llama"):
        BlockStack(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2)))


@pytest.mark.parametrize(
    "removed, message",
    [
        ([1, 1], "duplicate"),
        ([6], "out of range"),
        ([-1], "out of range"),
        (list(range(6)), "at least one"),
    ],
)
def test_bad_removal_sets_are_rejected(removed, message):
    with pytest.raises(UserError, match=message):
        validate_removed(removed, 6)


def test_parse_block_list():
    assert parse_block_list("3, 7,8") == [3, 7, 8]
    with pytest.raises(UserError):
        parse_block_list("3,x")
    with pytest.raises(UserError):
        parse_block_list("")


def pack_branches(prefix, branches, pad=3, width=None):
    """One packed row ``[prefix][branch 1][branch 2]...`` with its segments and restarted positions."""
    ids, segments, positions = list(prefix), [0] * len(prefix), list(range(len(prefix)))
    for number, branch in enumerate(branches, start=1):
        ids += branch
        segments += [number] * len(branch)
        positions += range(len(prefix), len(prefix) + len(branch))
    padding = (width or len(ids)) - len(ids)
    return (ids + [pad] * padding, segments + [-1] * padding, positions + [0] * padding)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_branches_equal_each_branch_run_alone(architecture, attention):
    """Prefix + branches in one sequence (4-D mask, restarted positions) = each prefix + branch alone.

    The prefix (11) plus a branch is longer than the sliding window (8) of mistral and gemma3_text, so the
    window must be applied to the restarted positions; the second row is padded.
    """
    model = tiny_model(architecture)
    model.config._attn_implementation = attention
    stack = BlockStack(model)
    generator = torch.Generator().manual_seed(4)

    def tokens(count):
        return torch.randint(4, 256, (count,), generator=generator).tolist()

    items = [(tokens(11), [tokens(3), tokens(1), tokens(6)]), (tokens(5), [tokens(2), tokens(4)])]
    width = max(len(prefix) + sum(map(len, branches)) for prefix, branches in items)
    rows = [pack_branches(prefix, branches, width=width) for prefix, branches in items]
    input_ids, segments, positions = (torch.tensor([row[i] for row in rows]) for i in range(3))
    mask = stack.segment_attention_mask(segments, positions)
    assert isinstance(mask, dict) == (architecture == "gemma3_text")  # the only one mixing layer types
    removed = {2}
    with torch.no_grad():
        batch = stack.prepare(input_ids, mask, positions)
        packed = stack.head(stack.run_blocks(batch.hidden, batch, stack.kept_blocks(removed)))
    assert torch.isfinite(packed).all()
    for row, (prefix, branches) in enumerate(items):
        start = len(prefix)
        for branch in branches:
            alone = stack.forward(torch.tensor([prefix + branch]), removed)[0]
            torch.testing.assert_close(packed[row, : len(prefix)], alone[: len(prefix)], rtol=0, atol=1e-5)
            torch.testing.assert_close(
                packed[row, start : start + len(branch)], alone[len(prefix) :], rtol=0, atol=1e-5
            )
            start += len(branch)


def test_segment_masks_need_a_dense_mask_implementation():
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    stack = BlockStack(model)
    assert not stack.supports_segment_masks
    with pytest.raises(ValueError, match="takes no 4-D attention mask"):
        stack.segment_attention_mask(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None])
