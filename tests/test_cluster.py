"""Cluster mode: two real server processes on one PostgreSQL database and one Redis. A run
started on one is followed, resumed, cancelled and approved through the other, and ends
truthfully when its process dies."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from agentstream import cli
from agentstream.events import INTERRUPTED
from agentstream.sse import SSEDecoder
from cluster_fixtures import events, posted, rest, until
from conftest import FORWARDED_ONLY, free_port, read_events, wait_until
from fakes.test_app import COUNTED
from processes import TAKEOVER_LEASE, ServerProcess, cluster, start_redis

COUNT = "/api/agents/counter/run/stream"


def test_a_run_started_on_one_process_is_followed_live_from_the_other(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with posted(a, b, "/api/agents/counter/run/stream", {"message": "go"}) as post:
        seen = until(post.events, "content_delta")
        run_id, joined_at = seen[0]["run_id"], seen[-1]["seq"]
        with post.on_b.stream(
            "GET",
            f"/api/agents/runs/{run_id}/stream",
            headers={"Last-Event-ID": str(joined_at)},
        ) as followed:
            assert followed.status_code == 200
            following = list(events(followed))
        everything = seen + rest(post.events)

    assert everything[-1]["event"] == "complete"
    deltas = [f["delta"] for f in everything if f["event"] == "content_delta"]
    assert "".join(deltas) == "".join(f"{n} " for n in range(1, COUNTED + 1))
    # From B: exactly what A's own client got after the join, with their seqs as ids.
    assert [e.json() for e in following] == [f for f in everything if f["seq"] > joined_at]
    assert [e.id for e in following] == [str(e.json()["seq"]) for e in following]


def test_a_follower_that_drops_resumes_on_the_other_process_without_gap_or_duplicate(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with posted(a, b, "/api/agents/counter/run/stream", {"message": "go"}) as post:
        run_id = until(post.events, "start")[0]["run_id"]
        with post.on_b.stream("GET", f"/api/agents/runs/{run_id}/stream") as first:
            from_b = events(first)
            part = [next(from_b).json() for _ in range(10)]
        # the connection dropped after ten frames; the client resumes from the last
        with post.on_a.stream(
            "GET",
            f"/api/agents/runs/{run_id}/stream",
            headers={"Last-Event-ID": str(part[-1]["seq"])},
        ) as second:
            resumed = part + rest(events(second))
        original = rest(post.events)

    seqs = [f["seq"] for f in resumed]
    assert seqs == list(range(1, seqs[-1] + 1)), "every seq once, in order"
    assert resumed[-1]["event"] == "complete"
    assert resumed[-1]["content"] == "".join(f"{n} " for n in range(1, COUNTED + 1))
    assert original[-1] == resumed[-1]


def test_a_run_is_cancelled_through_the_other_process(two: list[ServerProcess]) -> None:
    a, b = two
    with posted(a, b, "/api/agents/waiter/run/stream", {"message": "go"}) as post:
        run_id = until(post.events, "tool_call")[0]["run_id"]
        cancelled = post.on_b.post(f"/api/agents/runs/{run_id}/cancel")
        after = rest(post.events)
        again = post.on_b.post(f"/api/agents/runs/{run_id}/cancel")
        run = post.on_b.get(f"/api/agents/runs/{run_id}").json()

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"run_id": run_id, "status": "cancelled"}
    [settled] = [f for f in after if f["event"] == "tool_result"]
    assert settled["status"] == "cancelled"
    assert after[-1] == {
        "event": "error",
        "status": "cancelled",
        "message": "Run cancelled",
        "seq": after[-1]["seq"],
    }
    assert run["status"] == "cancelled"
    assert again.status_code == 409, "it has ended"


def test_a_run_paused_on_one_process_is_approved_on_the_other_and_finishes(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with a.live.client() as on_a, b.live.client() as on_b:
        with on_a.stream("POST", "/api/agents/asker/run/stream", json={"message": "go"}) as started:
            frames = [e.json() for e in read_events(started)]
        run_id = frames[0]["run_id"]
        [asked] = [f for f in frames if f["event"] == "approval_requested"]
        decided = on_b.post(
            f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": asked["tool_call_id"]}
        )
        assert decided.status_code == 200, decided.text
        # It runs now, on whichever process took it: follow it from A.
        with on_a.stream(
            "GET",
            f"/api/agents/runs/{run_id}/stream",
            headers={"Last-Event-ID": str(frames[-1]["seq"])},
            timeout=60,
        ) as followed:
            after = [e.json() for e in read_events(followed)]

    events = [f["event"] for f in after]
    assert "tool_result" in events
    assert after[-1]["event"] == "complete"
    assert after[-1]["content"] == "done"


def test_sigkill_of_the_process_running_a_run_ends_it_interrupted_for_every_viewer(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with posted(a, b, "/api/agents/waiter/run/stream", {"message": "go"}) as post:
        before = until(post.events, "tool_call")
        run_id = before[0]["run_id"]
        with post.on_b.stream("GET", f"/api/agents/runs/{run_id}/stream", timeout=30) as followed:
            from_b = events(followed)
            first = next(from_b).json()
            a.kill()
            following = [first, *rest(from_b)]
        run = post.on_b.get(f"/api/agents/runs/{run_id}").json()

    stopped = {"event": "error", "status": "interrupted", "message": INTERRUPTED}
    assert following[-1] == {**stopped, "seq": following[-1]["seq"]}
    assert following[-1]["seq"] > before[-1]["seq"], "after everything its viewers saw"
    assert (run["status"], run["error"]) == ("interrupted", stopped["message"])
    persisted = [f for f in before if f["event"] not in FORWARDED_ONLY]
    assert run["events"][: len(persisted)] == persisted, "what was stored before the kill"
    assert run["events"][-1] == following[-1]


def test_a_viewer_who_comes_after_a_process_died_gets_every_event_it_stored(
    two: list[ServerProcess],
) -> None:
    """A run watched only where it executes goes to Redis in the quiet batches (up to a
    second apart): a process that dies between two loses what it had not sent. The process
    that ends the run writes the persisted events the run's stream lacks before its end, so
    a viewer elsewhere who comes later gets each of them, then the end."""
    a, b = two
    with posted(a, b, "/api/agents/waiter/run/stream", {"message": "go"}) as post:
        before = until(post.events, "tool_call")
        run_id = before[0]["run_id"]
        a.kill()  # the tool call waits in a quiet batch

        def interrupted() -> bool:
            run = post.on_b.get(f"/api/agents/runs/{run_id}").json()
            return bool(run["status"] == "interrupted")

        wait_until(interrupted, timeout=30)
        with post.on_b.stream("GET", f"/api/agents/runs/{run_id}/stream", timeout=30) as later:
            frames = [e.json() for e in read_events(later)]

    persisted = [f for f in before if f["event"] not in FORWARDED_ONLY]
    assert [f for f in frames if f["event"] not in FORWARDED_ONLY][:-1] == persisted
    assert frames[-1]["event"] == "error"
    assert frames[-1]["status"] == "interrupted"


def test_one_conversation_takes_one_run_at_a_time_across_processes(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with posted(a, b, "/api/agents/waiter/run/stream", {"message": "go"}) as post:
        [first] = until(post.events, "start")
        refused = post.on_b.post(
            "/api/agents/waiter/run/stream",
            json={"message": "again", "session_id": first["session_id"]},
        )
        kept = post.on_b.delete(f"/api/sessions/{first['session_id']}")
        post.on_b.post(f"/api/agents/runs/{first['run_id']}/cancel")
        deleted = post.on_b.delete(f"/api/sessions/{first['session_id']}")

    assert refused.status_code == 409
    assert refused.json()["error"]["field"] == "session_id"
    assert kept.status_code == 409, "not while its run goes on in the other process"
    assert deleted.status_code == 204


def test_the_live_log_is_in_redis_under_the_prefix_and_expires_after_the_run(
    two: list[ServerProcess], redis_url: str
) -> None:
    a, _ = two
    with a.live.client() as on_a:
        frames = [
            e.json()
            for e in read_events(
                on_a.post("/api/agents/counter/run/stream", json={"message": "go"})
            )
        ]
    key = f"{a.live.settings.redis_prefix}:log:{frames[0]['run_id']}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    last = frames[-1]["seq"]

    def entries_now() -> list[tuple[str, dict[str, str]]]:
        return client.xrange(key)  # type: ignore[return-value]

    wait_until(lambda: entries_now()[-1:] == [(f"{last}-2", {"end": "1"})])
    entries = entries_now()
    assert entries[0] == ("0-1", {"open": "0"})
    assert entries[-1] == (f"{last}-2", {"end": "1"})
    written: list[int] = []  # the seqs of the entries between, in order
    for entry_id, fields in entries[1:-1]:
        if "e" in fields:
            written.append(json.loads(fields["e"])["seq"])
        else:  # a run's tokens, packed: keyed by the last one's seq
            pack = json.loads(fields["p"])
            written += range(pack["seq"], pack["seq"] + len(pack["deltas"]))
        assert entry_id == f"{written[-1]}-0"
    assert written == list(range(1, last + 1)), "every event once, in order"
    assert len(entries) < last, "the tokens of a run nobody follows elsewhere go packed"
    ttl = client.ttl(key)
    assert 0 < ttl <= a.live.settings.run_retention_seconds


def test_a_redis_restart_mid_run_loses_nothing_and_remote_viewers_resume(
    tmp_path: Path, cluster_database: str
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = start_redis(port)
    try:
        with (
            cluster(tmp_path, cluster_database, url, lease_seconds=TAKEOVER_LEASE) as (a, b),
            a.live.client() as on_a,
            b.live.client() as on_b,
            on_a.stream(
                "POST", "/api/agents/counter/run/stream", json={"message": "go"}
            ) as started,
        ):
            from_a = events(started)
            run_id = until(from_a, "content_delta")[0]["run_id"]
            with on_b.stream("GET", f"/api/agents/runs/{run_id}/stream") as followed:
                from_b = events(followed)
                part = [next(from_b).json()]
                server.terminate()  # Redis goes away, and forgets everything
                server.wait(10)
                part += rest(from_b)
            server = start_redis(port)
            own = rest(from_a)
            key = f"{b.live.settings.redis_prefix}:log:{run_id}"
            wait_until(lambda: redis.Redis(port=port).exists(key))  # the queued writes went in
            with on_b.stream(
                "GET",
                f"/api/agents/runs/{run_id}/stream",
                headers={"Last-Event-ID": str(part[-1]["seq"])},
            ) as resumed:
                tail = rest(events(resumed))
            run = on_b.get(f"/api/agents/runs/{run_id}").json()
    finally:
        server.terminate()
        server.wait(10)

    counted = "".join(f"{n} " for n in range(1, COUNTED + 1))
    assert own[-1]["event"] == "complete", "the run's own client never noticed"
    assert own[-1]["content"] == counted
    assert part[-1]["event"] != "complete", "the remote viewer's stream ended with Redis"
    assert tail[-1] == own[-1], "resumed, it ends as the run did"
    seqs = [f["seq"] for f in part + tail]
    assert seqs == sorted(set(seqs)), "no frame twice"
    assert (run["status"], run["content"]) == ("completed", counted)


def test_sigterm_drains_a_process_while_the_other_follows_and_serves_on(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with posted(a, b, COUNT, {"message": "go"}) as post:
        run_id = until(post.events, "content_delta")[0]["run_id"]
        with post.on_b.stream("GET", f"/api/agents/runs/{run_id}/stream") as followed:
            from_b = events(followed)
            first = next(from_b).json()
            a.process.send_signal(signal.SIGTERM)
            following = [first, *rest(from_b)]
        own = rest(post.events)
        exit_code = a.process.wait(30)
        after = [e.json() for e in read_events(post.on_b.post(COUNT, json={"message": "again"}))]
        run = post.on_b.get(f"/api/agents/runs/{run_id}").json()

    counted = "".join(f"{n} " for n in range(1, COUNTED + 1))
    assert own[-1] == following[-1], "the draining process's client and the other's alike"
    assert (following[-1]["event"], following[-1]["content"]) == ("complete", counted)
    assert run["status"] == "completed"
    assert exit_code == -signal.SIGTERM, "a clean stop: uvicorn ends by the signal it got"
    assert after[-1]["event"] == "complete", f"the other process takes the new runs: {after[-1]}"


def test_more_viewers_in_the_other_process_than_redis_has_connections_by_default(
    two: list[ServerProcess],
) -> None:
    """redis-py pools 100 connections; each remote viewer waits on one at a time."""
    a, b = two
    viewers = 150

    async def follow(client: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
        async with client.stream("GET", f"/api/agents/runs/{run_id}/stream") as response:
            assert response.status_code == 200
            decoder = SSEDecoder()
            return [e.json() async for chunk in response.aiter_bytes() for e in decoder.feed(chunk)]

    async def watch(run_id: str) -> list[list[dict[str, Any]]]:
        limits = httpx.Limits(max_connections=viewers)
        async with httpx.AsyncClient(
            base_url=b.live.url, headers=b.live.headers, timeout=60, limits=limits
        ) as client:
            return await asyncio.gather(*(follow(client, run_id) for _ in range(viewers)))

    with (
        a.live.client() as on_a,
        on_a.stream("POST", COUNT, json={"message": "go"}) as started,
    ):
        from_a = events(started)
        run_id = until(from_a, "start")[0]["run_id"]
        seen = asyncio.run(watch(run_id))
        own = rest(from_a)

    assert all(frames[-1] == own[-1] for frames in seen), "every viewer to the end"


def test_password_guesses_count_once_whichever_process_they_reach(
    two: list[ServerProcess],
) -> None:
    a, b = two
    with a.live.client() as on_a:
        deployed = on_a.post(
            "/api/chat-deployments",
            json={
                "slug": "guarded",
                "agent_id": "demo",
                "access": "password",
                "password": "correct horse",
            },
        )
    assert deployed.status_code == 201, deployed.text
    statuses = [
        httpx.post(f"{live.url}/api/chat/guarded", json={"password": "guess"}).status_code
        for live in [a.live, b.live] * 5 + [b.live, a.live]
    ]
    assert statuses == [401] * 10 + [429, 429], "ten guesses in all (spec 000), wherever"


def test_a_key_revoked_and_an_agent_edited_through_one_process_count_on_the_other_at_once(
    two: list[ServerProcess], cluster_database: str
) -> None:
    """Each process keeps the keys and agents it looked up (``DefinitionsCache``): a change
    made through the other process, or by a command straight to the database, counts from
    the very next request."""
    a, b = two
    database = ("--database-url", cluster_database)
    key = CliRunner().invoke(cli.app, ["keys", "create", "ci", *database]).stdout.strip()

    def version_run_on_b(client: httpx.Client) -> int:
        with client.stream("POST", COUNT, json={"message": "go"}) as response:
            run_id = rest(events(response))[-1]["run_id"]
        return int(client.get(f"/api/agents/runs/{run_id}").json()["agent_version"])

    with (
        a.live.client() as on_a,
        httpx.Client(base_url=b.live.url, headers={"apikey": key}, timeout=10) as on_b,
    ):
        assert version_run_on_b(on_b) == 1  # B has looked the key and the agent up
        edited = on_a.patch("/api/agents/counter", json={"instructions": "Count."})
        assert edited.json()["version"] == 2
        assert version_run_on_b(on_b) == 2

        revoked = CliRunner().invoke(cli.app, ["keys", "revoke", "ci", *database])
        assert revoked.exit_code == 0, revoked.output
        assert on_b.get("/api/agents/counter").status_code == 401
        assert on_a.get("/api/agents/counter").status_code == 200  # its own key still works
