"""The HTTP request block's client, safe against server-side request forgery.

Workflow authors choose the URL, so the server must not become their way into its own
network. Only http and https are spoken; the host is resolved here and every address it
resolves to must be public (not private, loopback, link-local, multicast, reserved...)
unless the allow-list names its network; the connection then goes to the address that was
checked, not to a second lookup an attacker's DNS could answer differently. Redirects are
followed by hand, each hop checked the same way, and credentials (``CREDENTIALS``) are not
sent on to another origin, as httpx and browsers do. Proxies from the environment are ignored
(they would connect on our behalf, unchecked).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any

import anyio
import httpx

from agentstream.workflows.errors import BlockFailed

__all__ = ["CREDENTIALS", "AddressRefused", "SafeHttpClient"]

CREDENTIALS = ("authorization", "proxy-authorization", "cookie")
"""Headers dropped when a redirect leads to another scheme, host or port: the author meant
them for the first site only."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SIX_TO_FOUR_RELAYS = ipaddress.ip_network("192.88.99.0/24")
"""The deprecated 6to4 relay anycast prefix (RFC 7526): routed to whichever relay is near."""
NAT64 = ipaddress.ip_network("64:ff9b::/96")
"""The well-known NAT64 prefix: its last 32 bits are the IPv4 address reached."""


class AddressRefused(BlockFailed):
    """The URL's scheme, or an address its host resolves to, is not allowed."""


class SafeHttpClient:
    """Sends one block's request (and follows its redirects) to public addresses only."""

    def __init__(
        self,
        *,
        allow: Iterable[str | IPNetwork] = (),
        max_redirects: int = 5,
        max_body_bytes: int = 5_000_000,
    ) -> None:
        """``allow``: networks permitted although not public, e.g. ``"10.0.0.0/8"`` or
        ``"127.0.0.1/32"`` (from the server's configuration, never from a workflow)."""
        self.allow = [ipaddress.ip_network(net) for net in allow]
        self.max_redirects = max_redirects
        self.max_body_bytes = max_body_bytes

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: Any,
    ) -> dict[str, Any]:
        """The response as a block output: ``status``, ``headers`` and ``body`` (parsed when
        JSON). A status of 400 or more raises ``BlockFailed``. The caller bounds the time."""
        target, sent = _parse(url), httpx.Headers(headers)
        async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
            for _ in range(self.max_redirects + 1):
                response, content = await self._send(client, method, target, sent, body)
                location = response.headers.get("location")
                if not (response.is_redirect and location):
                    return _output(target, response, content)
                following = target.join(location)
                if _origin(following) != _origin(target):
                    for name in CREDENTIALS:
                        sent.pop(name, None)
                target = following
                if response.status_code == 303 or (
                    response.status_code in (301, 302) and method == "POST"
                ):
                    method, body = "GET", None
        raise BlockFailed(f"More than {self.max_redirects} redirects from {target.host}")

    async def _send(
        self,
        client: httpx.AsyncClient,
        method: str,
        target: httpx.URL,
        headers: httpx.Headers,
        body: Any,
    ) -> tuple[httpx.Response, bytes]:
        """The response and at most ``max_body_bytes`` of its body."""
        try:
            response = await self._connect(client, method, target, headers, body)
            try:
                content = bytearray()
                async for chunk in response.aiter_bytes():
                    content += chunk
                    if len(content) > self.max_body_bytes:
                        raise BlockFailed(
                            f"The response from {target.host} is over {self.max_body_bytes:,} bytes"
                        )
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise BlockFailed(
                f"{method} request to {target.host} failed: {exc or type(exc).__name__}"
            ) from None
        return response, bytes(content)

    async def _connect(
        self,
        client: httpx.AsyncClient,
        method: str,
        target: httpx.URL,
        headers: httpx.Headers,
        body: Any,
    ) -> httpx.Response:
        """Send to the checked addresses, the next one if one cannot be reached, naming the
        host in ``Host`` and in TLS SNI (so the certificate is checked against the name)."""
        failure = None
        headers = headers.copy()
        headers["Host"] = target.netloc.decode("ascii")  # replacing the author's, in any case
        for address in await self.check(target):
            request = client.build_request(
                method,
                target.copy_with(host=str(address)),
                headers=headers,
                json=body,
                extensions={"sni_hostname": target.host},
            )
            try:
                return await client.send(request, stream=True)
            except httpx.ConnectError as exc:
                failure = exc
        assert failure is not None  # a host resolves to at least one address
        raise failure

    async def check(self, url: httpx.URL) -> list[IPAddress]:
        """The addresses to connect to for ``url``: every address its host resolves to must
        be allowed. Raises ``AddressRefused`` naming the address and why."""
        if url.scheme not in ("http", "https"):
            raise AddressRefused(f"Only http and https URLs are allowed, not {url.scheme!r}")
        if not url.host:
            raise BlockFailed(f"The URL {url} has no host")
        try:
            found = await anyio.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise BlockFailed(f"Cannot resolve {url.host!r}: {exc}") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
        for address in addresses:
            if reason := self._refusal(address):
                via = "" if url.host == str(address) else f"{url.host!r} resolves to "
                raise AddressRefused(
                    f"Refused: {via}{address}, not a public address ({reason}); allow its "
                    "network in the server's configuration to permit it"
                )
        return list(dict.fromkeys(addresses))

    def _refusal(self, address: IPAddress) -> str | None:
        """What kind of non-public address this is, or None if it may be reached."""
        if any(address in network for network in self.allow):
            return None
        if (wrapped := _wrapped_ipv4(address)) is not None:
            return self._refusal(wrapped)
        kinds = {  # most telling first: loopback and link-local addresses are private too
            "loopback": address.is_loopback,
            "site-local": isinstance(address, ipaddress.IPv6Address) and address.is_site_local,
            "6to4 relay": address in SIX_TO_FOUR_RELAYS,
            "link-local": address.is_link_local,
            "multicast": address.is_multicast,
            "unspecified": address.is_unspecified,
            "reserved": address.is_reserved,
            "private": address.is_private,
            "not global": not address.is_global,
        }
        return next((kind for kind, matches in kinds.items() if matches), None)


def _parse(url: str) -> httpx.URL:
    """``url``, or ``BlockFailed`` saying it is not valid: httpx refuses hosts such as
    ``0177.0.0.1`` or full-width digits (and an invalid redirect fails the request)."""
    try:
        return httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BlockFailed(f"The URL {url!r} is not valid: {exc}") from None


def _wrapped_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, which is where it leads: IPv4-mapped
    (``::ffff:127.0.0.1``), 6to4 (``2002:7f00:1::``) or NAT64 (``64:ff9b::7f00:1``)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.ipv4_mapped or address.sixtofour


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def _output(url: httpx.URL, response: httpx.Response, content: bytes) -> dict[str, Any]:
    if response.status_code >= 400:
        raise BlockFailed(
            f"{url.host} answered {response.status_code} {response.reason_phrase}".rstrip()
        )
    body: Any = content.decode(response.encoding or "utf-8", errors="replace")
    if response.headers.get("content-type", "").split(";")[0].strip().endswith("json"):
        with suppress(ValueError):  # mislabelled: keep the text
            body = json.loads(content)
    return {"status": response.status_code, "headers": dict(response.headers), "body": body}
