"""Block access: the composed forward equals the model's own, and skipping equals a shortened model."""

import copy

import pytest
import torch

from depthprune.errors import UserError
from pruning.models import BlockStack, parse_block_list, validate_removed
from tiny_models import tiny_model

ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "gemma3_text"]


def shortened_copy(model, removed):
    """The reference: a deep copy whose block list and per-layer config lists drop ``removed``."""
    short = copy.deepcopy(model)
    short.model.layers = torch.nn.ModuleList(
        [block for i, block in enumerate(short.model.layers) if i not in removed])
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
    torch.testing.assert_close(stack.forward(padded, {2}, mask)[:, :10], stack.forward(input_ids, {2}),
                               rtol=0, atol=1e-5)


def test_unsupported_architecture_names_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(UserError, match="supported: llama"):
        BlockStack(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2)))


@pytest.mark.parametrize("removed, message", [
    ([1, 1], "duplicate"), ([6], "out of range"), ([-1], "out of range"), (list(range(6)), "at least one"),
])
def test_bad_removal_sets_are_rejected(removed, message):
    with pytest.raises(UserError, match=message):
        validate_removed(removed, 6)


def test_parse_block_list():
    assert parse_block_list("3, 7,8") == [3, 7, 8]
    with pytest.raises(UserError):
        parse_block_list("3,x")
    with pytest.raises(UserError):
        parse_block_list("")
