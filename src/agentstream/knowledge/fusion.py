"""Reciprocal rank fusion: one ranking out of several whose scores do not compare.

A full-text rank (BM25 on SQLite, ``ts_rank`` on PostgreSQL) and a cosine similarity have
different scales, so they are not added; each ranking instead gives an item ``1 / (k +
rank)`` and the sums are ranked (Cormack, Clarke and Büttcher, SIGIR 2009, with their
``k = 60``). An item found by both rankings rises above one found by either alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

__all__ = ["RRF_K", "reciprocal_rank_fusion"]

RRF_K = 60

Item = TypeVar("Item", bound=Hashable)


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Item]], *, k: int = RRF_K
) -> list[tuple[Item, float]]:
    """Every ranked item with its fused score, best first; ties keep the order in which the
    rankings (the first one first) found them."""
    scores: dict[Item, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda scored: -scored[1])
