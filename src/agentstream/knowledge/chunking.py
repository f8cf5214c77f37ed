"""Cut a document into passages small enough to embed and to quote.

A chunk is a span of the document's text, never rewritten: its offsets point into the
extracted text, so a citation can show exactly where a passage came from. Chunks follow
paragraphs and start afresh at each Markdown heading; a paragraph longer than a chunk is
cut at whitespace into overlapping windows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from agentstream.knowledge.extract import Section

__all__ = ["CHUNK_CHARACTERS", "Chunk", "chunk"]

CHUNK_CHARACTERS = 800
"""About 200 tokens: well inside the embedding model's 256-token window."""
_OVERLAP = 120
_PARAGRAPH = re.compile(r"\S(?:.*?\S)??(?=[ \t]*\n\s*\n|\s*\Z)", re.DOTALL)
_HEADING = re.compile(r"#{1,6}\s")
SECTION_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class Chunk:
    position: int
    """Its place in the document, from 0."""
    text: str
    start: int
    """Offset of its first character in the document's text (sections joined by a blank line)."""
    end: int
    page: int | None


def chunk(sections: Sequence[Section], *, size: int = CHUNK_CHARACTERS) -> list[Chunk]:
    """The document's chunks, in order."""
    chunks: list[Chunk] = []
    offset = 0
    for section in sections:
        for start, end in _pack(list(_pieces(section.text, size)), section.text, size):
            chunks.append(
                Chunk(
                    position=len(chunks),
                    text=section.text[start:end],
                    start=offset + start,
                    end=offset + end,
                    page=section.page,
                )
            )
        offset += len(section.text) + len(SECTION_SEPARATOR)
    return chunks


def _pieces(text: str, size: int) -> Iterator[tuple[int, int]]:
    """Paragraph spans, long ones cut into windows of at most ``size``."""
    for paragraph in _PARAGRAPH.finditer(text):
        start, end = paragraph.span()
        while end - start > size:
            cut = text.rfind(" ", start + size // 2, start + size)
            cut = cut if cut > start else start + size
            yield start, cut
            start = max(cut - _OVERLAP, start + 1)
            start = text.find(" ", start, cut) + 1 or start  # begin on a word
        yield start, end


def _pack(pieces: list[tuple[int, int]], text: str, size: int) -> Iterator[tuple[int, int]]:
    """Neighbouring pieces joined while they fit; a heading always opens a chunk."""
    if not pieces:
        return
    first, last = pieces[0]
    for start, end in pieces[1:]:
        if end - first > size or _HEADING.match(text, start):
            yield first, last
            first = start
        last = end
    yield first, last
