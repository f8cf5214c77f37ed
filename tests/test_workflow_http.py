"""The HTTP request block against a real local server: loopback reachable only when the
allow-list permits it, by address or by a name resolving to it, redirects re-checked."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from agentstream.runtime.context import RunContext
from agentstream.workflows import (
    BlockFailed,
    ExecutionResult,
    SafeHttpClient,
    WorkflowEngine,
    parse_workflow,
)
from agentstream.workflows.http_block import AddressRefused
from fakes.server import run_app

pytestmark = pytest.mark.anyio

LOOPBACK = ["127.0.0.0/8", "::1/128"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def echo(request: Request) -> Response:
    body = await request.body()
    return JSONResponse(
        {
            "method": request.method,
            "host": request.headers["host"],
            "token": request.headers.get("x-token"),
            "authorization": request.headers.get("authorization"),
            "cookie": request.headers.get("cookie"),
            "hosts": request.headers.getlist("host"),
            "json": (await request.json()) if body else None,
        }
    )


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    app = Starlette(
        routes=[
            Route("/echo", echo, methods=["GET", "POST"]),
            Route("/text", lambda _: PlainTextResponse("plain")),
            Route("/moved", lambda _: RedirectResponse("/echo", status_code=302)),
            Route("/away", lambda request: RedirectResponse(request.query_params["to"])),
            Route("/to-private", lambda _: RedirectResponse("http://10.1.2.3/x")),
            Route("/missing", lambda _: PlainTextResponse("no", status_code=404)),
            Route("/big", lambda _: PlainTextResponse("x" * 2_000)),
        ]
    )
    with run_app(app, name="The test site") as url:
        yield url


@pytest.fixture(scope="module")
def other_site() -> Iterator[str]:
    """Another origin: the same address, another port."""
    app = Starlette(routes=[Route("/echo", echo)])
    with run_app(app, name="The other test site") as url:
        yield url


async def fetch(
    url: str, allow: list[str] | None = None, **config: Any
) -> tuple[ExecutionResult, list[Any]]:
    flow = parse_workflow(
        {
            "id": "fetch",
            "blocks": [
                {"id": "start", "type": "start"},
                {"id": "call", "type": "http", "url": url, **config},
                {"id": "out", "type": "response", "output": "<call.body>"},
            ],
            "edges": [{"from": "start", "to": "call"}, {"from": "call", "to": "out"}],
        }
    )
    events: list[Any] = []

    async def sink(batch: Any) -> None:
        events.extend(batch)

    engine = WorkflowEngine(http=SafeHttpClient(allow=allow or []))
    with anyio.fail_after(10):
        result = await engine.execution(flow, RunContext("wfx_http", sink=sink)).run(
            {"token": "t0k"}
        )
    return result, events


def block_error(events: list[Any]) -> str:
    [error] = [e.error for e in events if e.type == "block_error"]
    return str(error)


async def test_an_allowed_loopback_request_returns_parsed_json(site: str) -> None:
    result, events = await fetch(
        f"{site}/echo",
        LOOPBACK,
        method="POST",
        headers={"X-Token": "<start.input.token>"},
        body={"q": "<start.input.token>"},
    )
    port = httpx.URL(site).port
    assert result.result == {
        "method": "POST",
        "host": f"127.0.0.1:{port}",
        "token": "t0k",
        "authorization": None,
        "cookie": None,
        "hosts": [f"127.0.0.1:{port}"],
        "json": {"q": "t0k"},
    }
    [output] = [e.output for e in events if e.type == "block_output" and e.block_id == "call"]
    assert output["status"] == 200
    assert output["headers"]["content-type"] == "application/json"


async def test_a_name_resolving_to_loopback_is_reached_with_its_host_header(site: str) -> None:
    url = site.replace("127.0.0.1", "localhost")
    result, _ = await fetch(f"{url}/echo", LOOPBACK)
    assert result.result["host"] == f"localhost:{httpx.URL(site).port}"


async def test_text_bodies_and_redirects(site: str) -> None:
    result, _ = await fetch(f"{site}/text", LOOPBACK)
    assert result.result == "plain"
    result, _ = await fetch(f"{site}/moved", LOOPBACK)
    assert result.result["method"] == "GET"


CREDENTIALS = {"Authorization": "Bearer s3cret", "Cookie": "session=s3cret", "X-Token": "t0k"}


async def test_credentials_do_not_follow_a_redirect_to_another_origin(
    site: str, other_site: str
) -> None:
    result, _ = await fetch(f"{site}/away?to={other_site}/echo", LOOPBACK, headers=CREDENTIALS)
    assert result.result["host"] == httpx.URL(other_site).netloc.decode()
    assert (result.result["authorization"], result.result["cookie"]) == (None, None)
    assert result.result["token"] == "t0k"  # other headers are the author's to send anywhere


async def test_credentials_follow_a_redirect_within_the_origin(site: str) -> None:
    result, _ = await fetch(f"{site}/away?to=/echo", LOOPBACK, headers=CREDENTIALS)
    assert result.result["authorization"] == "Bearer s3cret"
    assert result.result["cookie"] == "session=s3cret"


async def test_a_host_header_of_the_author_is_replaced_not_doubled(site: str) -> None:
    result, _ = await fetch(f"{site}/echo", LOOPBACK, headers={"host": "internal.example"})
    assert result.result["hosts"] == [httpx.URL(site).netloc.decode()]


async def test_loopback_is_refused_without_the_allow_list_naming_the_address(site: str) -> None:
    result, events = await fetch(f"{site}/echo")
    assert block_error(events) == (
        "Refused: 127.0.0.1, not a public address (loopback); "
        "allow its network in the server's configuration to permit it"
    )
    assert result.status == "error"


async def test_a_name_resolving_to_loopback_is_refused_too(site: str) -> None:
    url = site.replace("127.0.0.1", "localhost")
    _, events = await fetch(f"{url}/echo")
    assert block_error(events).startswith(
        "Refused: 'localhost' resolves to 127.0.0.1, not a public address (loopback)"
    )


async def test_a_redirect_to_a_private_address_is_refused(site: str) -> None:
    _, events = await fetch(f"{site}/to-private", ["127.0.0.1/32"])
    assert block_error(events).startswith("Refused: 10.1.2.3, not a public address (private)")


async def test_other_schemes_are_refused() -> None:
    for url in ("file:///etc/passwd", "ftp://example.com/x", "gopher://127.0.0.1:70/"):
        _, events = await fetch(url, LOOPBACK)
        assert block_error(events).startswith("Only http and https URLs are allowed")


@pytest.mark.parametrize(
    "url",
    [
        "http://0177.0.0.1/",
        "http://127.000.000.001/",
        "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/",
    ],
    ids=["octal", "zero-padded", "full-width-digits"],
)
async def test_a_url_the_client_cannot_parse_is_a_block_error(url: str) -> None:
    result, events = await fetch(url, LOOPBACK)
    assert result.status == "error"
    assert block_error(events).startswith(f"The URL {url!r} is not valid: Invalid ")


async def test_error_statuses_and_oversized_bodies_fail_the_block(site: str) -> None:
    _, events = await fetch(f"{site}/missing", LOOPBACK)
    assert block_error(events) == "127.0.0.1 answered 404 Not Found"

    flow_result, events = await fetch(f"{site}/big", LOOPBACK)
    assert flow_result.status == "completed"
    client = SafeHttpClient(allow=LOOPBACK, max_body_bytes=1_000)
    with pytest.raises(BlockFailed, match="over 1,000 bytes"):
        await client.request("GET", f"{site}/big", headers={}, body=None)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "not global"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::", "loopback"),
        ("2002:a9fe:a9fe::", "link-local"),
        ("2002:a00:1::", "private"),
        ("64:ff9b::7f00:1", "loopback"),
        ("fec0::1", "site-local"),
        ("192.88.99.1", "6to4 relay"),
    ],
)
async def test_every_kind_of_internal_address_is_refused(address: str, kind: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(AddressRefused, match=rf"not a public address \({kind}\)"):
        await SafeHttpClient().check(httpx.URL(f"http://{host}/"))


async def test_public_addresses_and_allowed_networks_pass_the_check() -> None:
    assert await SafeHttpClient().check(httpx.URL("http://8.8.8.8/")) == [
        ipaddress.ip_address("8.8.8.8")
    ]
    assert await SafeHttpClient().check(httpx.URL("http://[2002:808:808::]/")) == [
        ipaddress.ip_address("2002:808:808::")
    ], "6to4 of a public address"
    allowed = SafeHttpClient(allow=["10.0.0.0/8"])
    assert await allowed.check(httpx.URL("https://10.9.8.7:8443/")) == [
        ipaddress.ip_address("10.9.8.7")
    ]
