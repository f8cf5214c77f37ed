"""Field types shared by request bodies."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

__all__ = ["MessageText"]


def _no_nul(text: str) -> str:
    # PostgreSQL text cannot hold NUL, and no person types one: refuse it up front.
    if "\x00" in text:
        raise ValueError("may not contain NUL (\\u0000) characters")
    return text


MessageText = Annotated[str, Field(min_length=1, max_length=200_000), AfterValidator(_no_nul)]
"""What a person sends: 1 to 200,000 characters, no NUL."""
