"""HTMX hygiene in one place: a page view renders its whole template for a normal
request and only the named partial for an HTMX request that asked for it (not a
boosted one, not a history restore), and says so in `Vary`."""

from __future__ import annotations

from django.shortcuts import render
from django.utils.cache import patch_vary_headers


def wants_fragment(request) -> bool:
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def render_page(request, template: str, context: dict, partial: str | None = None, status: int = 200):
    name = f"{template}#{partial}" if partial and wants_fragment(request) else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ["HX-Request"])
    return response
