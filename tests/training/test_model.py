"""The small decoder-only transformer: causal, sized by the tokenizer, loss ignores -100."""

from __future__ import annotations

import math

import pytest
import torch

from llm.training.model import IGNORE_INDEX, TransformerLM


def _model(**kw) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(vocab_size=257, max_seq_len=16, d_model=32, n_layers=2, n_heads=4, **kw).eval()


def test_causal_a_future_token_never_changes_past_logits() -> None:
    model = _model()
    x = torch.randint(0, 257, (2, 16))
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 257
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(y)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-4)


def test_loss_starts_near_uniform_and_ignores_padding() -> None:
    model = _model()
    x = torch.randint(0, 257, (4, 16))
    labels = torch.roll(x, -1, dims=1)
    with torch.no_grad():
        logits, loss = model(x, labels)
    assert logits.shape == (4, 16, 257)
    assert abs(float(loss) - math.log(257)) < 0.5
    masked = labels.clone()
    masked[:, 8:] = IGNORE_INDEX
    with torch.no_grad():
        _, half = model(x, masked)
    manual = torch.nn.functional.cross_entropy(logits[:, :8].reshape(-1, 257), labels[:, :8].reshape(-1))
    assert torch.allclose(half, manual, atol=1e-6)


def test_shape_errors_are_clear() -> None:
    with pytest.raises(ValueError, match=r"model.d_model \(30\) must be divisible by model.n_heads \(4\)"):
        TransformerLM(vocab_size=10, max_seq_len=8, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="a batch of 17 tokens is longer than the model's max_seq_len 16"):
        _model()(torch.zeros(1, 17, dtype=torch.long))


def test_output_head_is_tied_to_the_embedding() -> None:
    model = _model()
    assert model.head.weight is model.tok_emb.weight
    assert model.tok_emb.weight.shape == (257, 32)


def test_packed_samples_with_position_ids_train_as_if_each_had_its_own_row() -> None:
    model = _model()
    torch.manual_seed(1)
    a, b = torch.randint(0, 257, (1, 5)), torch.randint(0, 257, (1, 7))
    packed = torch.cat([a, b, torch.zeros(1, 2, dtype=torch.long)], dim=1)  # + 2 padding tokens (position 0)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 0]])
    with torch.no_grad():
        alone_a, _ = model(a)
        alone_b, _ = model(b)
        together, _ = model(packed, position_ids=positions)
        unaware, _ = model(packed)
    assert torch.allclose(together[:, :5], alone_a, atol=1e-5)
    assert torch.allclose(together[:, 5:12], alone_b, atol=1e-5)
    assert not torch.allclose(unaware[:, 5:12], alone_b, atol=1e-3)  # without them, b sees a
    assert torch.isfinite(together).all()  # padding attends to itself: no empty attention row


def test_position_ids_of_another_shape_are_refused() -> None:
    with pytest.raises(ValueError, match=r"position_ids has shape \(1, 3\), input_ids \(1, 4\)"):
        _model()(torch.zeros(1, 4, dtype=torch.long), position_ids=torch.zeros(1, 3, dtype=torch.long))


def test_llm_generate_and_generate_share_one_sampling_default() -> None:
    """The CLI's defaults are generate()'s (top-k 5, 0.8), so a plain llm-generate reads as the demo's text."""
    import inspect

    from llm.training.generate import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, build_parser, generate

    args = build_parser().parse_args(["--checkpoint", "x"])
    params = inspect.signature(generate).parameters
    assert (args.temperature, args.top_k) == (DEFAULT_TEMPERATURE, DEFAULT_TOP_K) == (
        params["temperature"].default, params["top_k"].default)
    assert DEFAULT_TOP_K == 5 and build_parser().parse_args(["--checkpoint", "x", "--top-k", "0"]).top_k == 0


def test_generate_samples_only_among_the_top_k_tokens() -> None:
    import torch

    from llm.training.generate import generate

    class Fixed(torch.nn.Module):  # logits favour tokens 0..4 in order, every other token far below
        max_seq_len = 8

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            logits = torch.full((1, ids.shape[1], 50), -1.0)
            logits[..., :5] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
            return logits, None

    picks = set(generate(Fixed(), [0], 200, seed=1))
    assert picks <= set(range(5)) and len(picks) > 1
