"""The chat access cookie: what it proves, and that no string a client sends can break it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentstream.server.chat_access import SessionSigner

SIGNER = SessionSigner(b"secret")


@given(st.text())
def test_any_string_is_at_most_no_token(token: str) -> None:
    assert SIGNER.verify(token, "slug", binding="") is None


@given(st.text(), st.text(), st.text())
def test_arbitrary_parts_are_at_most_no_token(identity: str, expires: str, mac: str) -> None:
    assert SIGNER.verify(f"{identity}.{expires}.{mac}", "slug", binding="") is None


@given(st.text())
def test_a_signed_identity_comes_back(identity: str) -> None:
    token = SIGNER.sign("slug", identity=identity, binding="hash")
    assert SIGNER.verify(token, "slug", binding="hash") == identity
    assert SIGNER.verify(token, "other", binding="hash") is None
    assert SIGNER.verify(token, "slug", binding="new hash") is None


def test_malformed_tokens_seen_in_the_wild() -> None:
    valid = SIGNER.sign("slug", identity="ann@example.com", binding="")
    _, _, mac = valid.split(".")
    for token in (".\xb2.x", f".{'9' * 5000}.{mac}", f"..{mac}", f".\xb2\xb2.{mac}", "a.b.c.d"):
        assert SIGNER.verify(token, "slug", binding="") is None
