"""Knowledge bases: ingest and search of 1,000 and 10,000 chunks, beside brute-force numpy.

Ingest runs ``Knowledge.add_document`` on a real SQLite file (extract, chunk, store), with
the embedding model timed on its own beside it: on two cores the model takes minutes for
10,000 chunks, so each distinct text is embedded once. Search runs ``Knowledge.search``
(revision check, scoring, passages read back) with the query's vector already known; the
baseline is one numpy matrix product and top-k over the same vectors in memory. Embedding a
query is timed on its own.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agentstream.knowledge.chunking import CHUNK_CHARACTERS
from agentstream.knowledge.embedding import MiniLM
from agentstream.knowledge.service import Knowledge
from agentstream.store import Store
from agentstream.store.knowledge import KnowledgeStore
from bench.tables import markdown_table, text_table

SIZES = (1_000, 10_000)
QUICK_SIZES = (200, 1_000)
UNIQUE = 1_000
"""Distinct paragraphs: larger sizes repeat them, so the model runs on 1,000 texts at most."""
QUICK_UNIQUE = 200
SEARCHES = 50
TOP_K = 5
_WORDS = tuple(
    [
        "ship",
        "lighthouse",
        "harbour",
        "storm",
        "tide",
        "reef",
        "lamp",
        "keeper",
        "coast",
        "beam",
        "night",
        "fog",
        "rock",
        "sail",
        "garden",
        "tomato",
        "basil",
        "water",
        "sun",
        "soil",
        "seed",
        "harvest",
        "travel",
        "flight",
        "receipt",
        "hotel",
        "budget",
        "meal",
        "policy",
        "audit",
        "contract",
        "invoice",
        "engine",
        "database",
        "stream",
        "token",
        "model",
        "agent",
        "tool",
    ]
)
HEADER = ("chunks", "what", "agentstream", "baseline", "ratio")


def paragraphs(count: int, seed: int = 7) -> list[str]:
    """One paragraph per chunk: random sentences, more than half a chunk long, so that no
    two share one."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words: list[str] = []
        while len(" ".join(words)) < CHUNK_CHARACTERS * 0.6:
            words += [*rng.choices(_WORDS, k=9), "."]
        out.append(" ".join(words))
    return out


class _Remembering:
    """The embedder, remembering each text's vector: ingest is then timed without the model,
    whose cost is measured on its own."""

    def __init__(self, embedder: MiniLM) -> None:
        self.name, self.dimensions = embedder.name, embedder.dimensions
        self._embedder = embedder
        self._known: dict[str, npt.NDArray[np.float32]] = {}

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._known]
        if missing:
            self._known.update(zip(missing, await self._embedder.embed(missing), strict=True))
        return np.stack([self._known[t] for t in texts])


async def _measure_size(chunks: int, unique: list[str], data_dir: Path) -> dict[str, Any]:
    texts = (unique * (chunks // len(unique) + 1))[:chunks]
    embedder = _Remembering(MiniLM())
    started = time.perf_counter()
    matrix = await embedder.embed(texts)
    embedding = (time.perf_counter() - started) * chunks / len(set(texts))

    store = await Store.open(f"sqlite+aiosqlite:///{data_dir / f'kb{chunks}.db'}")
    try:
        knowledge = Knowledge(KnowledgeStore(store.db), embedder, vectors=True)
        base = await knowledge.create_base("bench")
        started = time.perf_counter()
        document = await knowledge.add_document(
            base.id, name="bench.txt", media_type="text/plain", data="\n\n".join(texts).encode()
        )
        ingest = time.perf_counter() - started
        assert document.chunk_count == chunks, document.chunk_count

        queries = [" ".join(random.Random(i).choices(_WORDS, k=6)) for i in range(SEARCHES)]
        query_vectors = await embedder.embed(queries)  # remembered: search times itself only
        await knowledge.search([base.id], queries[0], top_k=TOP_K)  # loads the vectors
        ours, numpy, embed_query = [], [], []
        for query, vector in zip(queries, query_vectors, strict=True):
            started = time.perf_counter()
            await knowledge.search([base.id], query, top_k=TOP_K)
            ours.append(time.perf_counter() - started)
            started = time.perf_counter()
            scores = matrix @ vector
            best = np.argpartition(-scores, TOP_K)[:TOP_K]
            best[np.argsort(-scores[best])]
            numpy.append(time.perf_counter() - started)
            started = time.perf_counter()
            await embedder.embed([query + " again"])
            embed_query.append(time.perf_counter() - started)
    finally:
        await store.close()
    return {
        "chunks": chunks,
        "embedding_s": round(embedding, 3),
        "ingest_s": round(ingest, 3),
        "search_ms_p50": round(statistics.median(ours) * 1000, 3),
        "numpy_ms_p50": round(statistics.median(numpy) * 1000, 3),
        "query_embedding_ms_p50": round(statistics.median(embed_query) * 1000, 3),
    }


def measure(quick: bool = False) -> dict[str, Any]:
    unique = paragraphs(QUICK_UNIQUE if quick else UNIQUE)
    with tempfile.TemporaryDirectory() as data_dir:
        runs = [
            asyncio.run(_measure_size(size, unique, Path(data_dir)))
            for size in (QUICK_SIZES if quick else SIZES)
        ]
    return {"sizes": runs, "top_k": TOP_K, "searches": SEARCHES}


def _rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for run in result["sizes"]:
        chunks = f"{run['chunks']:,}"
        rows.append(
            (
                chunks,
                "ingest (s)",
                f"{run['ingest_s']:.2f} (extract, chunk, store)",
                f"{run['embedding_s']:.1f} (embedding model)",
                f"{run['ingest_s'] / run['embedding_s']:.3f}x",
            )
        )
        rows.append(
            (
                chunks,
                "search p50 (ms)",
                f"{run['search_ms_p50']:.2f} (+ {run['query_embedding_ms_p50']:.1f} to embed "
                "the query)",
                f"{run['numpy_ms_p50']:.3f} (numpy, vectors in memory)",
                f"{run['search_ms_p50'] / max(run['numpy_ms_p50'], 1e-6):.1f}x",
            )
        )
    return rows


def summary(result: dict[str, Any]) -> list[str]:
    return [
        "Ingest: agentstream's own work, against what the embedding model takes for the same "
        "chunks (measured on the distinct texts, scaled to the count).",
        f"Search: median of {result['searches']} queries, top {result['top_k']}, query vectors "
        "already computed on both sides; embedding a query is timed on its own.",
    ]


def report(result: dict[str, Any]) -> str:
    return "\n".join(
        ["Knowledge base ingest and search:", text_table(HEADER, _rows(result)), *summary(result)]
    )


def markdown(result: dict[str, Any]) -> str:
    return "\n\n".join([markdown_table(HEADER, _rows(result)), *summary(result)])


if __name__ == "__main__":
    print(report(measure()))
