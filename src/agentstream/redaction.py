"""PII redaction for public answers: emails, phones, credit cards, IBANs and IP addresses.

Option B (phonenumbers + python-stdnum + regexes + ipaddress), not Presidio: presidio-analyzer
measured here at 54 packages (spaCy, thinc, numpy), ~367 MB, 22 s install, 0.8-1.1 s import, and
its email check made tldextract fetch the suffix list. Option B: ~55 MB, ~5 s, ~60 ms, no network.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import phonenumbers
from stdnum import iban as _iban
from stdnum import luhn as _luhn
from stdnum import numdb

__all__ = ["Kind", "Redactor", "Span", "redact"]

Kind = Literal["EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "IP_ADDRESS"]

# On equal length, the kind validated by a checksum or a strict grammar wins.
_PRIORITY: dict[Kind | None, int] = {
    None: -1,
    "IBAN": 0,
    "CREDIT_CARD": 1,
    "EMAIL": 2,
    "IP_ADDRESS": 3,
    "PHONE": 4,
}


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    kind: Kind


_EMAIL_RE = re.compile(
    r"(?<![\w.%+-])"
    r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}"
    r"(?![A-Za-z0-9-])"
)

# Card shapes: 13-19 bare digits, 4-4-4[-4][-1..3] or 4-6-4/5 (Amex, Diners), one separator kind.
_CARD_RE = re.compile(
    r"(?<!\w)(?<!\d[.,-])"
    r"(?:\d{13,19}"
    r"|\d{4}(?P<s1>[ -])\d{4}(?:(?P=s1)\d{4}){1,2}(?:(?P=s1)\d{1,3})?"
    r"|\d{4}(?P<s2>[ -])\d{6}(?P=s2)\d{4,5})"
    r"(?!\w|[.,-]\d)"
)

# IBAN: country code, check digits, then alphanumerics, optionally in space-separated groups of 4.
_IBAN_RE = re.compile(
    r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]{4}){2,9}(?: ?[A-Za-z0-9]{1,3})?"
    r"(?![A-Za-z0-9])"
)
_IBAN_MIN_LEN = 15  # Norway
_IBAN_DB = numdb.get("iban")
_CARD_MIN_DIGITS = 13

_IPV4_RE = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\w|\.\d)")
_IPV6_RE = re.compile(
    r"(?<![\w:.])"
    r"(?:[0-9A-Fa-f]{0,4}:){2,7}"
    r"(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9A-Fa-f]{1,4})?"
    r"(?:%[A-Za-z0-9_.-]+)?"
    r"(?![\w:]|\.\w)"
)
_HEX_GROUP_RE = re.compile(r"[0-9A-Fa-f]{1,4}")


def _card_len(candidate: str) -> int | None:
    """Length of ``candidate`` if it is a Luhn-valid card number; else try it without its last
    group (a 4-4-4-4 card followed by a 3-digit CVV looks like a 19-digit number)."""
    while True:
        digits = candidate.replace(" ", "").replace("-", "")
        if len(digits) < _CARD_MIN_DIGITS:
            return None
        if digits.strip("0") and _luhn.is_valid(digits):
            return len(candidate)
        cut = max(candidate.rfind(" "), candidate.rfind("-"))
        if cut < 0:
            return None
        candidate = candidate[:cut]


def _iban_end(candidate: str) -> int | None:
    """Length of the longest prefix of ``candidate`` that is a valid IBAN (ending before a
    space or at the end), or None. Trailing words can be swallowed by the group pattern."""
    ends = [len(candidate)] + [i for i in range(len(candidate) - 1, 0, -1) if candidate[i] == " "]
    for end in ends:
        prefix = candidate[:end]
        if len(prefix.replace(" ", "")) < _IBAN_MIN_LEN:
            break
        # Mod 97 and the country's BBAN layout; national check digits are not required.
        if _iban.is_valid(prefix, check_country=False):
            return end
    return None


def _iban_shape_len(candidate: str) -> int | None:
    """For a candidate that is not a valid IBAN: the length of its leading part that looks like
    an IBAN of a known country (its expected number of characters), or None."""
    country, props = _IBAN_DB.info(candidate[:2].upper())[0]
    if len(country) != 2 or "bban" not in props:
        return None
    expected = 4 + sum(int(n) for n in re.findall(r"\d+", props["bban"]))
    seen = 0
    for i, char in enumerate(candidate):
        if char != " ":
            seen += 1
            if seen == expected:
                return i + 1
    return len(candidate)


def _ipv4_ok(candidate: str) -> bool:
    try:
        ipaddress.IPv4Address(candidate)
    except ValueError:
        return False
    return True


def _ipv6_ok(candidate: str) -> bool:
    address = candidate.split("%", 1)[0]
    # Require some substance so that code such as ``a[::2]`` or ``a::b`` is left alone: three
    # groups, or two with a full 4-digit one (``fe80::1``), or an embedded IPv4 tail.
    groups = _HEX_GROUP_RE.findall(address)
    longest = max(map(len, groups), default=0)
    if len(groups) < 3 and "." not in address and longest < 4:
        return False
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return True


def _scan(
    pattern: re.Pattern[str], text: str, accept: Callable[[str], int | None]
) -> Iterator[tuple[int, int]]:
    """Yield (start, end) of accepted candidates. ``accept`` returns the accepted length or None;
    after a rejection the search resumes one character later, so a valid item starting inside
    a rejected candidate is still found."""
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        length = accept(m.group())
        if length is None:
            pos = m.start() + 1
        else:
            yield m.start(), m.start() + length
            pos = m.start() + length


def _ibans(text: str) -> Iterator[tuple[int, int, Kind | None]]:
    pos = 0
    while (m := _IBAN_RE.search(text, pos)) is not None:
        start, candidate = m.start(), m.group()
        length = _iban_end(candidate)
        if length is not None:
            yield start, start + length, "IBAN"
            pos = start + length
            continue
        shape = _iban_shape_len(candidate)
        if shape is not None:
            yield start, start + shape, None
        pos = start + 1


def _whole(check: Callable[[str], bool]) -> Callable[[str], int | None]:
    return lambda s: len(s) if check(s) else None


class Redactor:
    """Finds and masks PII in text."""

    def __init__(self, *, default_region: str = "US") -> None:
        region = default_region.upper()
        if region not in phonenumbers.SUPPORTED_REGIONS:
            raise ValueError(f"unknown phone region: {default_region!r}")
        self._region = region
        # Load the phone metadata now, so the first real call does not pay for it.
        for _ in self._phones("+1 415-555-2671 +44 20 7946 0958"):
            pass

    def _phones(self, text: str) -> Iterator[tuple[int, int]]:
        matcher = phonenumbers.PhoneNumberMatcher(
            text, self._region, leniency=phonenumbers.Leniency.STRICT_GROUPING
        )
        for match in matcher:
            start, end, raw = match.start, match.end, match.raw_string
            # The matcher keeps an opening bracket whose partner lies outside: "(+1 415-555-2671)".
            if raw.startswith("(") and raw.count("(") > raw.count(")"):
                start += 1
            yield start, end

    def _candidates(self, text: str) -> Iterator[tuple[int, int, Kind | None]]:
        """All detections, possibly overlapping. Kind None marks a blocker: an IBAN-shaped token
        of a known country whose checksum fails, so that its digits are not reported as a card
        or a phone number."""
        if "@" in text:
            for m in _EMAIL_RE.finditer(text):
                yield m.start(), m.end(), "EMAIL"
        if not any(c.isdigit() for c in text):
            return
        for start, end in _scan(_CARD_RE, text, _card_len):
            yield start, end, "CREDIT_CARD"
        yield from _ibans(text)
        if "." in text:
            for start, end in _scan(_IPV4_RE, text, _whole(_ipv4_ok)):
                yield start, end, "IP_ADDRESS"
        if "::" in text or text.count(":") >= 7:
            for start, end in _scan(_IPV6_RE, text, _whole(_ipv6_ok)):
                yield start, end, "IP_ADDRESS"
        for start, end in self._phones(text):
            yield start, end, "PHONE"

    def find(self, text: str) -> list[Span]:
        """Non-overlapping PII spans, sorted by start. On overlap the longer span wins, then the
        more specific kind (IBAN, card, email, IP, phone)."""
        candidates = sorted(
            self._candidates(text),
            key=lambda c: (c[0] - c[1], _PRIORITY[c[2]], c[0]),
        )
        chosen: list[tuple[int, int, Kind | None]] = []  # sorted by start, non-overlapping
        starts: list[int] = []
        for cand in candidates:
            start, end, _ = cand
            i = bisect.bisect_right(starts, start)
            if i > 0 and chosen[i - 1][1] > start:
                continue
            if i < len(chosen) and chosen[i][0] < end:
                continue
            chosen.insert(i, cand)
            starts.insert(i, start)
        return [Span(start, end, kind) for start, end, kind in chosen if kind is not None]

    def redact(self, text: str) -> str:
        """``text`` with each PII span replaced by a placeholder such as ``[EMAIL]``."""
        parts: list[str] = []
        pos = 0
        for span in self.find(text):
            parts.append(text[pos : span.start])
            parts.append(f"[{span.kind}]")
            pos = span.end
        parts.append(text[pos:])
        return "".join(parts)


@functools.cache
def _default_redactor() -> Redactor:
    return Redactor()


def redact(text: str) -> str:
    """Redact ``text`` with a default (region "US") Redactor, built on first use."""
    return _default_redactor().redact(text)
