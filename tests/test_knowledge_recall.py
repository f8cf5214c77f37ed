"""Recall of knowledge search on a small labelled set: full text alone (the default install)
against hybrid (full text and vectors fused, with the ``embeddings`` extra).

Each passage is a chunk of its own (a Markdown heading opens one); each query names the
passages that answer it. Half the queries share words with their passages, half ask in
other words. ``pytest -s tests/test_knowledge_recall.py`` prints the figures that
docs/knowledge.md reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agentstream.knowledge.embedding import MiniLM
from agentstream.knowledge.service import Knowledge
from agentstream.store import Store
from agentstream.store.knowledge import KnowledgeStore

pytestmark = [pytest.mark.anyio, pytest.mark.embeddings]

TOP_K = 5

PASSAGES = {
    "handbook.md": {
        "flights": "Employees book flights through the travel desk at least fourteen days "
        "before departure. Economy class is the rule for flights under six hours.",
        "meals": "Meals abroad are reimbursed up to forty euros a day. Keep every receipt "
        "for the audit.",
        "hotels": "Hotel rooms are booked by the travel desk; a night in a capital city may "
        "cost up to one hundred and eighty euros.",
        "leave": "Every employee has twenty-eight days of paid annual leave. Unused days may "
        "be carried over until the end of March.",
        "sick": "If you are ill, tell your manager before ten in the morning. From the "
        "fourth day off, a doctor's note is required.",
        "remote": "Staff may work from home up to three days a week, provided their team "
        "agrees on one shared office day.",
        "laptop": "A new laptop is issued every four years. Report a lost or stolen "
        "computer to the IT service desk within one day.",
        "password": "Passwords must be at least fourteen characters long and are never "
        "shared, not even with colleagues from IT.",
    },
    "garden.md": {
        "tomatoes": "Tomatoes need at least six hours of direct sun each day. Water them "
        "deeply twice a week.",
        "basil": "Basil grows well beside tomatoes and keeps some pests away.",
        "compost": "Kitchen scraps, dry leaves and coffee grounds turn into compost in about "
        "six months if the heap is turned every few weeks.",
        "frost": "Young seedlings die in a night below freezing: keep them indoors until the "
        "last cold spell of spring has passed.",
        "slugs": "Slugs eat lettuce leaves at night. A ring of crushed eggshells around each "
        "plant keeps them off.",
        "roses": "Prune roses in late winter, cutting each stem just above an outward bud.",
    },
    "sea.md": {
        "lighthouse": "The lighthouse keeper lit the lamp every evening at dusk.",
        "reef": "Ships passing the rocky cape relied on the beam to stay clear of the reef.",
        "tides": "The moon's pull raises the sea twice a day; the highest tides follow the "
        "full and the new moon.",
        "knots": "A bowline makes a loop that neither slips nor jams, and unties easily "
        "after bearing a load.",
        "storm": "When the barometer falls quickly, a gale is coming: reef the sails and "
        "head for a sheltered harbour.",
        "fog": "In thick fog a vessel sounds one long blast on its horn every two minutes.",
    },
}

QUERIES: list[tuple[str, set[str]]] = [
    # Words of the passage.
    ("How many days before departure must flights be booked?", {"flights"}),
    ("Are meals abroad reimbursed?", {"meals"}),
    ("How long must a password be?", {"password"}),
    ("When should roses be pruned?", {"roses"}),
    ("What does the lighthouse keeper do at dusk?", {"lighthouse"}),
    ("How does a bowline loop behave under load?", {"knots"}),
    ("How often should tomatoes be watered?", {"tomatoes"}),
    ("Who books hotel rooms for a trip?", {"hotels", "flights"}),
    # Other words.
    ("How much can I spend on food when travelling?", {"meals"}),
    ("Which plant should go next to my vegetables?", {"basil"}),
    ("What warned sailors about dangerous stones?", {"reef", "lighthouse"}),
    ("How much holiday do I get each year?", {"leave"}),
    ("What should I do when my notebook computer goes missing?", {"laptop"}),
    ("How do I protect my salad from snails?", {"slugs"}),
    ("Can I do my job from my house?", {"remote"}),
    ("What signals bad weather approaching on a boat?", {"storm"}),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def document(passages: dict[str, str]) -> bytes:
    return "\n\n".join(f"# {key}\n\n{text}" for key, text in passages.items()).encode()


async def recall_at(
    k: int, knowledge: Knowledge, kb_id: str, labels: Callable[[str], str]
) -> float:
    """Mean over the queries of the share of their relevant passages in the top ``k``."""
    shares = []
    for query, relevant in QUERIES:
        found = {labels(c.text) for c in await knowledge.search([kb_id], query, top_k=k)}
        shares.append(len(relevant & found) / len(relevant))
    return sum(shares) / len(shares)


def label_of(texts: Sequence[tuple[str, str]]) -> Callable[[str], str]:
    """A chunk's label: the key of the passage it holds."""

    def label(text: str) -> str:
        return next(key for key, passage in texts if passage in text)

    return label


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_hybrid_search_recalls_more_than_full_text_alone(
    request: pytest.FixtureRequest, tmp_path: Path, database: str
) -> None:
    url = (
        request.getfixturevalue("postgres_url")
        if database == "postgresql"
        else f"sqlite+aiosqlite:///{tmp_path / 'recall.db'}"
    )
    store = await Store.open(url)
    try:
        hybrid = Knowledge(KnowledgeStore(store.db), MiniLM(), vectors=True)
        full_text = Knowledge(KnowledgeStore(store.db), MiniLM(), vectors=False)
        base = await hybrid.create_base("recall")
        for name, passages in PASSAGES.items():
            await hybrid.add_document(
                base.id, name=name, media_type="text/markdown", data=document(passages)
            )
        labels = label_of([(k, t) for ps in PASSAGES.values() for k, t in ps.items()])
        recall = {
            "full text": await recall_at(TOP_K, full_text, base.id, labels),
            "hybrid": await recall_at(TOP_K, hybrid, base.id, labels),
        }
    finally:
        await store.close()

    print(
        f"\n{database}: recall@{TOP_K} over {len(QUERIES)} queries, "
        f"{sum(map(len, PASSAGES.values()))} passages: "
        + ", ".join(f"{mode} {value:.2f}" for mode, value in recall.items())
    )
    assert recall["hybrid"] > recall["full text"]
    assert recall["hybrid"] >= 0.9
    assert recall["full text"] >= 0.5
