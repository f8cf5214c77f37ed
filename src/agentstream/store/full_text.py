"""Full-text ranking of knowledge chunks in the database, one query per dialect.

SQLite ranks with FTS5 (BM25) over the table ``kb_chunks_fts``, with Porter stemming, kept
in step with ``kb_chunks`` by triggers; PostgreSQL with ``ts_rank`` over the generated
``tsvector`` column ``kb_chunks.search_vector`` (English configuration, GIN index). Both
come from migration 0010.

A query is cut into words and matches a chunk holding any of them (a question rarely has
every word of its answer), less English stop words ("how", "do", "the"), which would
otherwise rank every chunk that has one. Punctuation and either engine's query syntax
(``AND``, ``NEAR``, ``*``, ``&``, ``!``, quotes) are never read as syntax.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, column, func, literal_column, select, table
from sqlalchemy.sql import ColumnElement

from agentstream.store.tables import ChunkRow

__all__ = ["full_text_ranking", "query_words"]

_WORD = re.compile(r"\w+")
"""What a query is cut into: no character of FTS5's or tsquery's syntax is one."""

# fmt: off
STOP_WORDS = frozenset({
    "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours",
    "yourself", "yourselves", "he", "him", "his", "himself", "she", "her", "hers",
    "herself", "it", "its", "itself", "they", "them", "their", "theirs", "themselves",
    "what", "which", "who", "whom", "this", "that", "these", "those", "am", "is", "are",
    "was", "were", "be", "been", "being", "have", "has", "had", "having", "do", "does",
    "did", "doing", "a", "an", "the", "and", "but", "if", "or", "because", "as", "until",
    "while", "of", "at", "by", "for", "with", "about", "against", "between", "into",
    "through", "during", "before", "after", "above", "below", "to", "from", "up", "down",
    "in", "out", "on", "off", "over", "under", "again", "further", "then", "once", "here",
    "there", "when", "where", "why", "how", "all", "any", "both", "each", "few", "more",
    "most", "other", "some", "such", "no", "nor", "not", "only", "own", "same", "so",
    "than", "too", "very", "s", "t", "can", "will", "just", "don", "should", "now",
})
# fmt: on
"""PostgreSQL's ``english`` stop words (Snowball's list), dropped on SQLite too, so that both
stores rank alike."""

_FTS5 = table("kb_chunks_fts", column("rowid"), column("text"), column("rank"))
_SEARCH_VECTOR: ColumnElement[Any] = literal_column("kb_chunks.search_vector")


def query_words(query: str) -> list[str]:
    """The query's words that count, lowercased, each once."""
    words = (word.lower() for word in _WORD.findall(query))
    return list(dict.fromkeys(word for word in words if word not in STOP_WORDS))


def full_text_ranking(dialect: str, words: Sequence[str]) -> Select[int]:
    """Ids of the chunks holding any of the words, best first."""
    return _postgresql(words) if dialect == "postgresql" else _fts5(words)


def _fts5(words: Sequence[str]) -> Select[int]:
    """By BM25 (FTS5's ``rank``), each word quoted so that it is only a word."""
    match = " OR ".join(f'"{word}"' for word in words)
    return (
        select(ChunkRow.id)
        .join(_FTS5, _FTS5.c.rowid == ChunkRow.id)
        .where(_FTS5.c.text.match(match))
        .order_by(_FTS5.c.rank, ChunkRow.id)
    )


def _postgresql(words: Sequence[str]) -> Select[int]:
    """By ``ts_rank``, the words stemmed as the column is."""
    query = func.to_tsquery(literal_column("'english'"), " | ".join(words))
    return (
        select(ChunkRow.id)
        .where(_SEARCH_VECTOR.op("@@")(query))
        .order_by(func.ts_rank(_SEARCH_VECTOR, query).desc(), ChunkRow.id)
    )
