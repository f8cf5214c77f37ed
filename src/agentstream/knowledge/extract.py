"""The text of an uploaded document: what is chunked, embedded and cited."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import PurePath

from pypdf import PdfReader
from pypdf.errors import PyPdfError

from agentstream.errors import UserError

__all__ = ["MEDIA_TYPES", "Section", "extract", "media_type_for"]

MEDIA_TYPES = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".pdf": "application/pdf",
}
"""What can be added to a knowledge base, by file extension."""


@dataclass(frozen=True, slots=True)
class Section:
    """A run of the document's text: a PDF page, or the whole of a text file."""

    text: str
    page: int | None = None
    """The PDF page it is on, from 1."""


def media_type_for(filename: str, declared: str | None) -> str:
    """The document's type: from its extension, else the declared type if it is one we read."""
    by_extension = MEDIA_TYPES.get(PurePath(filename).suffix.lower())
    if by_extension is not None:
        return by_extension
    declared = (declared or "").split(";")[0].strip().lower()
    if declared in MEDIA_TYPES.values():
        return declared
    known = ", ".join(sorted(MEDIA_TYPES))
    raise UserError(
        f"Cannot tell what kind of document {filename!r} is: use one of {known}", field="file"
    )


def extract(data: bytes, media_type: str) -> list[Section]:
    """The document's text in reading order; UserError if there is none to read."""
    sections = _pdf(data) if media_type == "application/pdf" else [Section(_text(data))]
    if not any(section.text.strip() for section in sections):
        hint = " (a scanned PDF has images, not text)" if media_type == "application/pdf" else ""
        raise UserError(f"The document has no text to search{hint}", field="file")
    return sections


def _text(data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"The document is not UTF-8 text (byte {exc.start} is invalid)", field="file"
        ) from None
    if "\x00" in text:  # no text file holds one, and PostgreSQL text cannot
        raise UserError(f"The document is not text (byte {data.index(0)} is NUL)", field="file")
    return text


def _pdf(data: bytes) -> list[Section]:
    try:
        reader = PdfReader(io.BytesIO(data))
        return [
            # a glyph without a character comes out as NUL, which no store can keep
            Section((page.extract_text() or "").replace("\x00", ""), page=number)
            for number, page in enumerate(reader.pages, start=1)
        ]
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"The document is not a readable PDF: {exc}", field="file") from None
