"""Who is asking, for the login throttle (django-axes' AXES_CLIENT_IP_CALLABLE)."""

from __future__ import annotations

import ipaddress


def client_ip(request) -> str:
    """The client's address. A request from this host's loopback came through the local TLS
    proxy (the deploy puts gunicorn on 127.0.0.1): the client is the last address of
    X-Forwarded-For, the one that proxy appended; addresses before it are the client's
    own claims and are never read. Anything else is its REMOTE_ADDR."""
    remote = request.META.get("REMOTE_ADDR", "")
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if forwarded and _is_loopback(remote):
        last = forwarded.rsplit(",", 1)[-1].strip()
        try:
            return str(ipaddress.ip_address(last))
        except ValueError:
            return remote
    return remote


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
