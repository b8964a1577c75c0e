"""Path converters for the URLconfs (registered in CoreConfig.ready)."""

from __future__ import annotations

from django.urls.converters import StringConverter


class NodeNameConverter(StringConverter):
    """`<node:name>`: a node's name, one path segment without control characters. No node
    has such a name (gpufleet.wire refuses it) and PostgreSQL refuses a NUL in text
    outright, so the resolver answers 404 before any view queries with it."""

    regex = r"[^/\x00-\x1f\x7f]+"
