"""A small decoder-only transformer (GPT-style) whose vocabulary comes from the tokenizer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def sample_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(batch, 1, seq, seq) booleans: causal, and only within a sample (a sample starts where its position is 0)."""
    sample = torch.cumsum(position_ids == 0, dim=1)  # which sample each token belongs to
    t = position_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return ((sample[:, :, None] == sample[:, None, :]) & causal)[:, None]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, both residual."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask`: None for plain causal attention, else a boolean (batch, 1, seq, seq), True = may attend."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    """Token + learned position embeddings, `n_layers` blocks, a tied output head."""

    def __init__(
        self,
        vocab_size: int,
        max_seq_len: int,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        d_ff: int | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"model.d_model ({d_model}) must be divisible by model.n_heads ({n_heads})")
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, d_ff or 4 * d_model, dropout) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying: fewer parameters, same quality at this size
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's variance flat with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits `(batch, seq, vocab)` and, given `labels` aligned with `input_ids`
        (label `t` is the target for position `t`, -100 ignored), the mean cross-entropy.

        `position_ids` (batch, seq), restarting at 0 where a packed sample (or document)
        starts: each token then attends only to earlier tokens of its own sample, and its
        position embedding counts from that sample's start, so packed samples train exactly
        as if each had a row of its own.
        """
        t = input_ids.shape[1]
        if t > self.max_seq_len:
            raise ValueError(f"a batch of {t} tokens is longer than the model's max_seq_len {self.max_seq_len}")
        mask = None
        if position_ids is None:
            pos = torch.arange(t, device=input_ids.device)
        else:
            if position_ids.shape != input_ids.shape:
                raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}, input_ids {tuple(input_ids.shape)}")
            pos, mask = position_ids, sample_mask(position_ids)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x, mask)
        logits = self.head(self.ln_f(x))
        if labels is None:
            return logits, None
        loss = F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
        )
        return logits, loss


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
