"""Markdown for the hosted chat page: an answer's text rendered to HTML on the server
(markdown-it-py: CommonMark, with tables and strikethrough) and sanitized by an allow-list
(nh3), so the page needs no renderer of its own and nothing an answer holds can run.
Raw HTML in the text is shown as text, never passed through."""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

__all__ = ["render_markdown"]

_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])

_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "s", "code", "pre",
    "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "img",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},
    "ol": {"start"},
}


def render_markdown(text: str) -> str:
    """Safe HTML of ``text`` as Markdown: links only to ``http``, ``https`` and
    ``mailto`` (opened without a referrer or an opener), no scripts, styles or handlers."""
    html = _MARKDOWN.render(text)
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    ).strip()
