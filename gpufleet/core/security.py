"""Who is asking: the client's address, for the login throttle (django-axes'
AXES_CLIENT_IP_CALLABLE) and the addresses that may scrape /metrics. Every reader of the
client's address goes through `client_ip`."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def client_ip(request) -> str:
    """The client's address: the peer's (REMOTE_ADDR), unless the peer is one of
    GPUFLEET_TRUSTED_PROXIES. Then X-Forwarded-For is read from the right, each trusted proxy
    having appended the address it was reached from, and the first address that is not a
    trusted proxy is the client. What lies left of it the client wrote itself, and is never read."""
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = _networks(settings.GPUFLEET_TRUSTED_PROXIES)
    peer = _address(remote)
    if peer is None or not _within(peer, proxies):
        return remote
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for entry in reversed(forwarded.split(",")):
        hop = _address(entry)
        if hop is None:
            # Not an address, so not one a trusted proxy appended: the trusted hops end here.
            break
        peer = hop
        if not _within(hop, proxies):
            break
    return str(peer)


def address_in(address: str, networks: Iterable[str]) -> bool:
    """Whether `address` (as `client_ip` gives it) lies in one of `networks` (IPs or CIDRs)."""
    parsed = _address(address)
    return parsed is not None and _within(parsed, _networks(networks))


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    # A dual-stack socket reports an IPv4 client as ::ffff:a.b.c.d; it is that IPv4 client.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _networks(values: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(value, strict=False) for value in values]


def _within(address: Address, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    return any(address in network for network in networks)
