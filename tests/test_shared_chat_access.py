"""Chat access is one for all the processes of a cluster: a password guess or a message
counts against the same window on every process (Redis, under the deployment's prefix), a
code mailed by one process signs in on another, once, and a cookie set by one is accepted
by all (the database). The code rules hold under concurrent redeems on both databases, and
the cookie key of a data directory from before the database kept it stays valid.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis
from sqlalchemy import make_url, select

from agentstream.config import Settings
from agentstream.server.chat_access import CodeBook, SessionSigner
from agentstream.store import Store
from agentstream.store.codes import CodeStore
from agentstream.store.server_secrets import ServerSecrets
from agentstream.store.tables import ChatCodeRow
from conftest import LiveServer, free_port, make_settings, postgres_admin, serve, wait_until
from processes import start_redis

REDIS_URL = os.environ.get("AGENTSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
MAIL: list[tuple[str, str]] = []


async def capture_mail(to: str, subject: str, body: str) -> None:
    MAIL.append((to, body))


def mailed_code(to: str) -> str:
    address, body = MAIL[-1]
    assert address == to
    return body.split("code is ")[1][:6]


@pytest.fixture(scope="module")
def redis_client() -> Iterator[redis.Redis]:
    """The Redis on this machine; skipped when none answers, except in CI."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        client.close()
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
    with client:
        yield client


@pytest.fixture(scope="module")
def cluster_settings(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, redis_client: redis.Redis
) -> Iterator[Callable[..., Settings]]:
    """Settings of processes sharing a database of this module's own and a Redis; each
    call gives a process a data directory of its own. Their Redis keys go afterwards."""
    name = f"agentstream_cluster_{uuid.uuid4().hex[:12]}"
    postgres_admin(f'CREATE DATABASE "{name}"')
    database = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    prefixes: list[str] = []

    def settings(prefix: str | None = None) -> Settings:
        prefixes.append(prefix or f"test-{uuid.uuid4().hex[:12]}")
        return make_settings(
            tmp_path_factory.mktemp("process"),
            database_url=database,
            redis_url=REDIS_URL,
            redis_prefix=prefixes[-1],
        )

    try:
        yield settings
    finally:
        for prefix in set(prefixes):
            for key in redis_client.scan_iter(f"{prefix}:*"):
                redis_client.delete(key)
        postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def cluster(cluster_settings: Callable[..., Settings]) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two server processes (in threads) of one cluster: one database, one Redis prefix."""
    first = cluster_settings()
    second = cluster_settings(first.redis_prefix)
    with (
        serve(first, email_sender=capture_mail) as a,
        serve(second, email_sender=capture_mail) as b,
    ):
        yield a, b


def deploy(live: LiveServer, **settings: Any) -> str:
    settings.setdefault("agent_id", "demo")
    with live.client() as client:
        response = client.post("/api/chat-deployments", json=settings)
    assert response.status_code == 201, response.text
    return str(settings["slug"])


def test_password_guesses_count_once_across_processes(
    cluster: tuple[LiveServer, LiveServer], redis_client: redis.Redis
) -> None:
    a, b = cluster
    slug = deploy(a, slug="guarded", access="password", password="correct horse")
    statuses = [
        httpx.post(f"{live.url}/api/chat/{slug}", json={"password": "guess"}).status_code
        for live in [a, b] * 5 + [b, a]
    ]
    assert statuses == [401] * 10 + [429, 429], "ten guesses in all, wherever they land"
    prefix = a.settings.redis_prefix
    assert list(redis_client.scan_iter(f"{prefix}:limits:*")), "the windows are under the prefix"


def test_messages_per_minute_count_once_across_processes(
    cluster: tuple[LiveServer, LiveServer],
) -> None:
    a, b = cluster
    slug = deploy(a, slug="two-a-minute", runs_per_minute_per_client=2)
    statuses = [
        httpx.post(f"{live.url}/api/chat/{slug}", json={"input": "hi"}, timeout=10).status_code
        for live in (a, b, a)
    ]
    assert statuses == [200, 200, 429]


def test_a_code_mailed_by_one_process_signs_in_on_another_once(
    cluster: tuple[LiveServer, LiveServer],
) -> None:
    a, b = cluster
    slug = deploy(a, slug="invited", access="email", allowed_emails=["@example.com"])
    email = {"email": "ann@example.com"}
    asked = httpx.post(f"{a.url}/api/chat/{slug}", json=email)
    assert (asked.status_code, asked.json()["error"]["field"]) == (401, "otp")
    code = mailed_code("ann@example.com")
    with httpx.Client(base_url=b.url, timeout=10) as on_b:
        signed_in = on_b.post(f"/api/chat/{slug}", json={**email, "otp": code})
        assert signed_in.json() == {"authenticated": True}
        cookies = on_b.cookies
    again = httpx.post(f"{a.url}/api/chat/{slug}", json={**email, "otp": code})
    assert again.status_code == 401, "a code works once, on any process"
    with httpx.Client(base_url=a.url, timeout=10, cookies=cookies) as on_a:
        assert on_a.get(f"/api/chat/{slug}").json()["authenticated"] is True
        answer = on_a.post(f"/api/chat/{slug}", json={"input": "hi"})
    assert answer.status_code == 200
    assert answer.text.endswith('data: "[DONE]"\n\n')


def test_a_server_closes_its_redis_connections_when_it_stops(
    cluster_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = cluster_settings()
    prefix = settings.redis_prefix

    def connected() -> int:
        clients = redis_client.client_list()
        return sum(client["name"] == f"{prefix}:limits" for client in clients)

    with serve(settings) as live:
        slug = deploy(live, slug=f"closing-{prefix}", access="password", password="correct horse")
        httpx.post(f"{live.url}/api/chat/{slug}", json={"password": "guess"})
        assert connected() > 0
    wait_until(lambda: connected() == 0)


def test_the_cookie_key_of_an_older_data_directory_is_adopted(tmp_path: Path) -> None:
    """It was kept in ``secret-key``: cookies it signed stay valid, and once it is in the
    database the file is no longer needed."""
    (tmp_path / "secret-key").write_text("kept-by-an-older-version\n")
    older = SessionSigner(b"kept-by-an-older-version")
    other = SessionSigner(b"another-key")

    def signed_in(live: LiveServer, signer: SessionSigner) -> bool:
        token = signer.sign("team", identity="ann@example.com", binding="email")
        cookies = {"agentstream_chat_team": token}
        with httpx.Client(base_url=live.url, timeout=10, cookies=cookies) as client:
            authenticated: bool = client.get("/api/chat/team").json()["authenticated"]
        return authenticated

    with serve(make_settings(tmp_path)) as live:
        deploy(live, slug="team", access="email", allowed_emails=["@example.com"])
        assert signed_in(live, older)
        assert not signed_in(live, other)
    (tmp_path / "secret-key").unlink()
    with serve(make_settings(tmp_path)) as live:
        assert signed_in(live, older)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgresql"])
async def processes(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[list[Store]]:
    """The stores of two processes over one database. On SQLite they are one process's:
    a second process refuses its data directory."""
    if request.param == "sqlite":
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
        stores = [store, store]
    else:
        url: str = request.getfixturevalue("postgres_url")
        stores = [await Store.open(url), await Store.open(url)]
    yield stores
    for store in set(stores):
        await store.close()


def books(stores: list[Store], ttl: float = 10 * 60) -> list[CodeBook]:
    """The code books of the processes (five tries a code)."""
    return [CodeBook(CodeStore(store.db), ttl=ttl) for store in stores]


def someone() -> tuple[str, str]:
    """A deployment and address no other test uses (the PostgreSQL database is shared)."""
    return f"slug-{uuid.uuid4().hex[:8]}", "ann@example.com"


def wrong(code: str) -> str:
    return f"{(int(code) + 1) % 10**6:06d}"


async def redeem_at_once(books: list[CodeBook], guesses: list[str], who: tuple[str, str]) -> int:
    """Redeem each guess at the same time, on the processes in turn; how many got in."""
    results: list[bool] = []

    async def redeem(book: CodeBook, guess: str) -> None:
        results.append(await book.redeem(*who, guess))

    async with anyio.create_task_group() as group:
        for n, guess in enumerate(guesses):
            group.start_soon(redeem, books[n % len(books)], guess)
    return sum(results)


@pytest.mark.anyio
async def test_of_processes_redeeming_one_code_at_once_exactly_one_gets_in(
    processes: list[Store],
) -> None:
    who = someone()
    a, b = books(processes)
    code = await a.issue(*who)
    assert await redeem_at_once([a, b], [code] * 12, who) == 1
    assert not await b.redeem(*who, code)


@pytest.mark.anyio
async def test_wrong_guesses_at_once_each_use_up_a_try(processes: list[Store]) -> None:
    who = someone()
    a, b = books(processes)
    code = await a.issue(*who)
    assert await redeem_at_once([a, b], [wrong(code)] * 4, who) == 0
    assert await b.redeem(*who, code), "four wrong guesses leave one try"
    code = await a.issue(*who)
    assert await redeem_at_once([a, b], [wrong(code)] * 5, who) == 0
    assert not await b.redeem(*who, code), "five wrong guesses use up all five tries"


@pytest.mark.anyio
async def test_a_new_code_replaces_the_last_and_old_codes_are_dropped(
    processes: list[Store],
) -> None:
    a, b = books(processes)
    expired, lapsed = books(processes, ttl=0)
    slug, email = someone()
    first = second = await a.issue(slug, email)
    while second == first:
        second = await b.issue(slug, email)
    assert not await a.redeem(slug, email, first)
    assert await a.redeem(slug, email, second)
    code = await expired.issue(slug, "bo@example.com")
    assert not await lapsed.redeem(slug, "bo@example.com", code), "past its ten minutes"
    kept = await a.issue(slug, "cy@example.com")
    async with processes[0].db.session() as db:
        rows = (await db.scalars(select(ChatCodeRow).where(ChatCodeRow.slug == slug))).all()
    assert [(row.email, row.tries_left) for row in rows] == [("cy@example.com", 5)]
    assert rows[0].digest == hashlib.sha256(kept.encode()).hexdigest(), "not the code itself"


@pytest.mark.anyio
async def test_processes_starting_together_agree_on_one_cookie_key(
    processes: list[Store],
) -> None:
    name = f"key-{uuid.uuid4().hex[:8]}"
    candidates = [f"candidate-{n}" for n in range(8)]
    keys: list[str] = []

    async def start(store: Store, candidate: str) -> None:
        keys.append(await ServerSecrets(store.db).get_or_create(name, candidate))

    async with anyio.create_task_group() as group:
        for n, candidate in enumerate(candidates):
            group.start_soon(start, processes[n % 2], candidate)
    assert len(set(keys)) == 1
    assert keys[0] in candidates
    assert await ServerSecrets(processes[1].db).get_or_create(name, "late") == keys[0]


def test_while_redis_is_away_a_guess_is_refused_with_503_not_counted_as_wrong(
    tmp_path: Path, cluster_settings: Callable[..., Settings]
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    redis_server = start_redis(port)
    settings = cluster_settings().model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"})
    try:
        with serve(settings) as live:
            slug = deploy(live, slug="guarded-away", access="password", password="correct horse")
            redis_server.terminate()
            redis_server.wait(10)
            refused = httpx.post(f"{live.url}/api/chat/{slug}", json={"password": "guess"})
    finally:
        redis_server.kill()
        redis_server.wait(10)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "unavailable"
    assert refused.headers["Retry-After"] == "5"
