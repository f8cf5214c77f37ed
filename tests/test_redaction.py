"""PII redaction: each kind in several formats, validation (Luhn, mod 97, IP ranges), overlaps,
text that must stay untouched, idempotence, and property tests over random words."""

import dataclasses
import itertools
import re
from collections.abc import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from stdnum import luhn

from agentstream.redaction import Kind, Redactor, Span, redact

R = Redactor()

PII: list[tuple[str, Kind]] = [
    ("jane.doe+tag@example.co.uk", "EMAIL"),
    ("john_smith@mail.example.com", "EMAIL"),
    ("+1 415-555-2671", "PHONE"),
    ("(415) 555-2671", "PHONE"),
    ("+44 20 7946 0958", "PHONE"),
    ("415.555.2671", "PHONE"),
    ("+33 1 42 68 53 00", "PHONE"),
    ("4111 1111 1111 1111", "CREDIT_CARD"),
    ("4111-1111-1111-1111", "CREDIT_CARD"),
    ("4111111111111111", "CREDIT_CARD"),
    ("5555555555554444", "CREDIT_CARD"),
    ("3782 822463 10005", "CREDIT_CARD"),
    ("DE89 3704 0044 0532 0130 00", "IBAN"),
    ("GB82WEST12345698765432", "IBAN"),
    ("GB82 WEST 1234 5698 7654 32", "IBAN"),
    ("FR14 2004 1010 0505 0001 3M02 606", "IBAN"),
    ("192.168.1.20", "IP_ADDRESS"),
    ("8.8.8.8", "IP_ADDRESS"),
    ("2001:db8::1", "IP_ADDRESS"),
    ("2001:0db8:85a3:0000:0000:8a2e:0370:7334", "IP_ADDRESS"),
    ("::ffff:192.0.2.1", "IP_ADDRESS"),
    ("fe80::1", "IP_ADDRESS"),
]

SAFE: list[str] = [
    "The quick brown fox jumps over the lazy dog.",
    "17 * 23 = 391",
    "In 2024 we shipped 3 releases; 1999 was a long time ago.",
    "It costs $1,299.00 (or 1.299,00 EUR) plus 7.5% tax.",
    "Meet me at 12:30, or at 09:15:00 if that is too late.",
    "Released on 2024-05-17 and again at 2024-05-17T12:30:00Z.",
    "Counting: 1 2 3 4 5 6 7 8 9 10.",
    "Pi is 3.14159 and e is 2.71828; version 1.2 of the spec.",
    "Use a[::2] or std::vector<int> or a::b in code.",
    "Not an IP: 999.1.1.1, nor 256.256.256.256, nor 1.2.3.",
    "Order #12345 was 100 200 300 400 500 units.",
    "Luhn-failing card 4111 1111 1111 1112 stays.",
    "Random 1234567812345678 stays, as does 1234-5678-1234-5678.",
    "Bad IBAN DE89 3704 0044 0532 0130 01 stays, GB82WEST12345698765433 too.",
    "An email-ish thing: user@localhost and @handle and a@b.",
    "Reply with [EMAIL] or [PHONE] placeholders untouched.",
    "",
    "   \n\t  ",
    "Ünïcödé wörds 日本語 — and emoji 🎉 are fine.",
]


@pytest.mark.parametrize(("token", "kind"), PII)
def test_each_kind_is_detected_in_a_sentence(token: str, kind: Kind) -> None:
    text = f"Please contact me at {token} tomorrow."
    assert R.find(text) == [Span(21, 21 + len(token), kind)]
    assert redact(text) == f"Please contact me at [{kind}] tomorrow."


@pytest.mark.parametrize(("token", "kind"), PII)
def test_detected_at_the_edges_and_before_punctuation(token: str, kind: Kind) -> None:
    assert redact(token) == f"[{kind}]"
    assert redact(f"({token}).") == f"([{kind}])."
    assert redact(f"{token}, {token}") == f"[{kind}], [{kind}]"


@pytest.mark.parametrize("text", SAFE)
def test_text_without_pii_is_untouched(text: str) -> None:
    assert R.find(text) == []
    assert redact(text) == text


def test_mixed_text_and_spans() -> None:
    text = (
        "Mail jane.doe+tag@example.co.uk or call +1 415-555-2671. Card 4111-1111-1111-1111, "
        "IBAN DE89 3704 0044 0532 0130 00, host 192.168.1.20 / 2001:db8::1, in 2024 at 12:30."
    )
    assert redact(text) == (
        "Mail [EMAIL] or call [PHONE]. Card [CREDIT_CARD], "
        "IBAN [IBAN], host [IP_ADDRESS] / [IP_ADDRESS], in 2024 at 12:30."
    )
    spans = R.find(text)
    assert [s.kind for s in spans] == [
        "EMAIL",
        "PHONE",
        "CREDIT_CARD",
        "IBAN",
        "IP_ADDRESS",
        "IP_ADDRESS",
    ]
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
    assert text[spans[0].start : spans[0].end] == "jane.doe+tag@example.co.uk"


def test_adjacent_items_are_each_redacted() -> None:
    text = "415-555-2671, 4111 1111 1111 1111; +44 20 7946 0958/192.168.1.20"
    assert redact(text) == "[PHONE], [CREDIT_CARD]; [PHONE]/[IP_ADDRESS]"
    assert redact("+1 415 555 2671 ext. 12 - thanks") == "[PHONE] - thanks"


def test_phone_digits_inside_an_email_are_part_of_the_email() -> None:
    assert R.find("call me.4155552671@example.com") == [Span(5, 30, "EMAIL")]


class _FixedCandidates(Redactor):
    """Feeds the overlap resolution fixed candidates, each overlapping one that starts earlier."""

    def _candidates(self, text: str) -> Iterator[tuple[int, int, Kind | None]]:
        yield 0, 10, "PHONE"
        yield 8, 30, "EMAIL"  # longer than the phone: wins
        yield 32, 52, "EMAIL"
        yield 35, 55, "CREDIT_CARD"  # as long as the email: the more specific kind wins
        yield 58, 62, "PHONE"
        yield 60, 76, None  # a blocker (IBAN-shaped, bad checksum) hides what it overlaps
        yield 80, 82, "IP_ADDRESS"


def test_overlaps_prefer_the_longer_then_the_more_specific_span() -> None:
    assert _FixedCandidates().find("x" * 90) == [
        Span(8, 30, "EMAIL"),
        Span(35, 55, "CREDIT_CARD"),
        Span(80, 82, "IP_ADDRESS"),
    ]


def test_a_card_starting_inside_a_rejected_candidate_is_found() -> None:
    # "1234 4111 1111 1111" fails Luhn; the card right after it must still be seen.
    assert redact("ref 1234 4111 1111 1111 1111 ok") == "ref 1234 [CREDIT_CARD] ok"


def test_span_is_frozen_and_slotted() -> None:
    span = Span(0, 1, "EMAIL")
    with pytest.raises(dataclasses.FrozenInstanceError):
        span.start = 2  # type: ignore[misc]
    assert not hasattr(span, "__dict__")


# --- validation -----------------------------------------------------------------------


@given(st.text(alphabet="0123456789", min_size=16, max_size=16), st.sampled_from(["", " ", "-"]))
@example("4111111111111112", " ")
def test_luhn_failing_16_digit_numbers_are_not_redacted(digits: str, sep: str) -> None:
    number = sep.join(digits[i : i + 4] for i in range(0, 16, 4))
    text = f"number {number} here"
    if luhn.is_valid(digits) and digits.strip("0"):
        assert redact(text) == "number [CREDIT_CARD] here"
    else:
        assert redact(text) == text


def test_card_followed_by_cvv_redacts_only_the_card() -> None:
    assert redact("card 4111 1111 1111 1111 123 exp 12/25") == "card [CREDIT_CARD] 123 exp 12/25"


def test_card_is_not_half_redacted_as_phone() -> None:
    # Its first ten digits alone would be a valid US phone number.
    assert redact("4155552671 is a phone") == "[PHONE] is a phone"
    text = "pay with 4155 5526 7100 0003 ok"
    assert luhn.is_valid("4155552671000003")
    assert R.find(text) == [Span(9, 28, "CREDIT_CARD")]


@pytest.mark.parametrize(
    "iban",
    [
        "DE89 3704 0044 0532 0130 01",  # checksum off by one
        "DE88 3704 0044 0532 0130 00",  # wrong check digits
        "GB82WEST12345698765433",
        "GB82 WEST 1234 5698 7654 33",
    ],
)
def test_invalid_iban_checksum_is_not_redacted_nor_its_digits(iban: str) -> None:
    text = f"transfer to {iban} please"
    assert R.find(text) == []
    assert redact(text) == text


def test_iban_followed_by_a_word_that_looks_like_a_group() -> None:
    assert redact("BE68 5390 0754 7034 THEN stop") == "[IBAN] THEN stop"
    assert redact("XX12 DE89 3704 0044 0532 0130 00") == "XX12 [IBAN]"


@pytest.mark.parametrize(
    "text",
    ["999.1.1.1", "1.2.3.256", "01.02.03.004x", "1.2.3.4.5", "12:30:45", "00:1a:2b:3c:4d:5e"],
)
def test_invalid_ips_are_not_redacted(text: str) -> None:
    assert redact(f"value {text} end") == f"value {text} end"


def test_ip_with_port_and_brackets() -> None:
    assert (
        redact("[2001:db8::1]:8080 and 10.0.0.1:443") == "[[IP_ADDRESS]]:8080 and [IP_ADDRESS]:443"
    )


def test_region_matters_for_national_phone_numbers() -> None:
    text = "ring 020 7946 0958 now"
    assert Redactor().redact(text) == text
    assert Redactor(default_region="GB").redact(text) == "ring [PHONE] now"


def test_unknown_region_is_rejected() -> None:
    with pytest.raises(ValueError, match="region"):
        Redactor(default_region="XX")


def test_module_level_redact_reuses_one_redactor() -> None:
    from agentstream import redaction

    redact("warm up")
    first = redaction._default_redactor()
    redact("+1 415-555-2671")
    assert redaction._default_redactor() is first


# --- idempotence and properties --------------------------------------------------------

_EXTENSION_LABEL = re.compile(r"e?xt(?:ension)?n?|anexo|x|int", re.IGNORECASE)
"""Words that libphonenumber reads as an extension's label after a phone number ("+1
415-555-2671 x 2024" is one number, its extension in it): redacted with it, by design."""
_WORD = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=10
).filter(lambda word: _EXTENSION_LABEL.fullmatch(word) is None)
_SAFE_TOKENS = [
    "2024",
    "1999",
    "17",
    "*",
    "=",
    "391",
    "$1,299.00",
    "12:30",
    "2024-05-17",
    "3.14",
    "v1.2",
    "50%",
    "#42",
    "1e9",
]
_PUNCT = st.sampled_from(["", "", "", ",", ".", ";", "!", "?", ":"])
# A chunk is a word with optional punctuation, optionally followed by one safe non-PII token, so
# safe numeric tokens are never adjacent to each other.
_CHUNK = st.builds(
    lambda word, punct, token: f"{word}{punct}" + (f" {token}" if token else ""),
    _WORD,
    _PUNCT,
    st.one_of(st.none(), st.sampled_from(_SAFE_TOKENS)),
)


@pytest.mark.parametrize("text", [t for t, _ in PII] + SAFE)
def test_redaction_is_idempotent(text: str) -> None:
    once = redact(f"x {text} y {text}")
    assert redact(once) == once


@pytest.mark.parametrize("label", ["x", "X", "ext.", "extension", "int"])
def test_a_phone_numbers_extension_is_redacted_with_it(label: str) -> None:
    assert redact(f"call +1 415-555-2671 {label} 2024 today") == "call [PHONE] today"


@settings(max_examples=300)
@given(st.lists(_CHUNK, max_size=30))
def test_random_safe_text_is_unchanged(chunks: list[str]) -> None:
    text = " ".join(chunks)
    assert redact(text) == text


@settings(max_examples=300)
@given(st.lists(_CHUNK, max_size=20), st.data())
def test_inserted_pii_is_always_replaced_and_the_rest_preserved(
    chunks: list[str], data: st.DataObject
) -> None:
    token, kind = data.draw(st.sampled_from(PII))
    index = data.draw(st.integers(min_value=0, max_value=len(chunks)))
    before, after = chunks[:index], chunks[index:]
    text = " ".join([*before, token, *after])
    expected = " ".join([*before, f"[{kind}]", *after])
    redacted = redact(text)
    assert redacted == expected
    assert redact(redacted) == redacted
