"""Choosers for text mixtures: which source the next record comes from, by records or by tokens.

* `round_robin` (the default): the live source with the fewest draws, lowest index first.
* `weighted`: the live source furthest behind its weight (a low-discrepancy schedule:
  the realised shares stay within one record of the weights at every point).
* `random`: a seeded draw by weight, from a hash of (seed, consumer, draw number).

Every choice is a pure function of the counts so far, so a mixture resumes from counts alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from llm.data.mix.schedule import MixSchedule, parse_schedule
from llm.data.mix.weights import check_weights as check_mix_weights

STRATEGIES = ("round_robin", "weighted", "random")
UNITS = ("records", "tokens")


def check_weights(weights: list[float] | None, n: int, strategy: str) -> list[float]:
    """Weights for `n` sources: the given ones (checked by the mix room's one check, summing to 1) or equal ones."""
    if strategy not in STRATEGIES:
        raise ValueError(f"streaming_dataset_mixing_strategy {strategy!r} is not known; use one of: {', '.join(STRATEGIES)}")
    if weights is None:
        if strategy == "weighted":
            raise ValueError("streaming_mixing_weights is required when streaming_dataset_mixing_strategy is weighted")
        return [1.0 / n] * n
    check_mix_weights(weights, n, "streaming_mixing_weights", sum_to_one=True)
    return [float(w) for w in weights]  # as given (they sum to 1): the choosers' draws stay what they were


def check_unit(unit: str) -> str:
    """`streaming_mixing_unit`: what a weight is a share of."""
    if unit not in UNITS:
        raise ValueError(f"streaming_mixing_unit {unit!r} is not known; use records (shares of records) "
                         "or tokens (shares of the trained tokens)")
    return unit


def check_schedule(schedule: Any, n: int, strategy: str, weights: list[float] | None) -> MixSchedule | None:
    """`streaming_mixing_schedule` checked for `n` sources (None when not given)."""
    if schedule is None:
        return None
    if weights is not None:
        raise ValueError("give streaming_mixing_weights or streaming_mixing_schedule, not both "
                         "(a schedule's first point holds the weights from step 0)")
    if strategy == "round_robin":
        raise ValueError("streaming_mixing_schedule needs streaming_dataset_mixing_strategy weighted or random "
                         "(round_robin ignores weights)")
    parsed = parse_schedule(schedule, n)
    if parsed.unit != "step":  # the text stream counts its schedule in steps; it must not read k samples as step k
        raise ValueError(f"streaming_mixing_schedule is by {parsed.unit}, but the text mixture takes step points "
                         "for now; give each point as step: k")
    return parsed


def unique_names(names: Sequence[str]) -> list[str]:
    """Source names for the accounting; a repeated name gets its index (`wiki`, `wiki#2`)."""
    out: list[str] = []
    for i, name in enumerate(names):
        out.append(name if name not in out else f"{name}#{i}")
    return out


def choose(strategy: str, live: list[int], counts: list[int], weights: list[float], seed: int, consumer: int,
           tokens: list[int] | None = None, drawn: int | None = None) -> int:
    """The source of the next draw, from the draws so far (`counts`, per source) and the live sources.

    `tokens` (per source) makes the weights shares of tokens (`choose_by_tokens`); `drawn` keys
    a random draw (default: the draws counted).
    """
    if tokens is not None:
        return choose_by_tokens(strategy, live, counts, tokens, weights, seed, consumer, drawn)
    if strategy == "round_robin":
        return min(live, key=lambda i: (counts[i], i))
    total_w = sum(weights[i] for i in live)
    if total_w <= 0:  # only zero-weight sources left: they are drawn in turn
        return min(live, key=lambda i: (counts[i], i))
    if strategy == "weighted":
        drawn = sum(counts[i] for i in live) + 1
        return max(live, key=lambda i: (weights[i] / total_w * drawn - counts[i], -i))
    return _draw(live, weights, total_w, seed, consumer, sum(counts) if drawn is None else drawn)


def choose_by_tokens(strategy: str, live: list[int], counts: list[int], tokens: list[int], weights: list[float],
                     seed: int, consumer: int, drawn: int | None = None) -> int:
    """The next source when weights are token shares: the live source furthest behind its share of tokens.

    Each source's tokens stay within one record of its share at every point (a low-discrepancy
    rule on tokens); `random` draws by weight / mean record length, so the expected token
    shares are the weights.
    """
    if strategy == "round_robin":
        weights = [1.0] * len(weights)
    total_w = sum(weights[i] for i in live)
    if total_w <= 0:  # only zero-weight sources left: the one with the fewest tokens
        return min(live, key=lambda i: (tokens[i], i))
    if strategy != "random":
        total = sum(tokens[i] for i in live)
        return max(live, key=lambda i: (weights[i] / total_w * total - tokens[i], weights[i], -i))
    seen = [tokens[i] / counts[i] for i in live if counts[i]]
    default = sum(seen) / len(seen) if seen else 1.0  # a source not drawn yet: the others' mean length
    rates = [0.0] * len(weights)
    for i in live:
        rates[i] = weights[i] / max(tokens[i] / counts[i] if counts[i] else default, 1e-9)
    return _draw(live, rates, sum(rates), seed, consumer, sum(counts) if drawn is None else drawn)


def _draw(live: list[int], weights: list[float], total_w: float, seed: int, consumer: int, k: int) -> int:
    """A seeded draw among the live sources by weight, keyed by (seed, consumer, draw number)."""
    digest = hashlib.blake2b(f"{seed}:{consumer}:{k}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2**64 * total_w
    for i in live:
        u -= weights[i]
        if u < 0:
            return i
    return live[-1]
