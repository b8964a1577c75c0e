"""Fixtures for the web pages: fleets ingested through the real snapshot path,
and a recorder in place of the broker (no agent runs in unit tests)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import snapshot


def ingest(name: str, gpus: int = 2, at: datetime | None = None, **kwargs) -> Node:
    result = ingest_snapshot(snapshot(name, gpus, at=at, **kwargs))
    assert result.outcome == "accepted", result
    return Node.objects.get(name=name)


@pytest.fixture
def make_fleet(db):
    """make_fleet(n, gpus=2, prefix="node") ingests n nodes named node-00, node-01, ..."""

    def make(count: int, gpus: int = 2, prefix: str = "node", **kwargs) -> list[Node]:
        return [ingest(f"{prefix}-{i:02d}", gpus, **kwargs) for i in range(count)]

    return make


@pytest.fixture
def alpha(db) -> Node:
    """An 8-GPU node whose agent allows the cdi fix."""
    return ingest("alpha", 8, fixes=["cdi"])


def hx(**headers) -> dict:
    """Headers of an HTMX request (as the test client takes them)."""
    return {"HTTP_HX_REQUEST": "true", **{f"HTTP_{k.upper()}": v for k, v in headers.items()}}


def hours_ago(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)
