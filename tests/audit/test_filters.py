"""AuditFilter on its own and on /audit/: node, action, and an invalid value as
an error with nothing listed."""

from __future__ import annotations

import pytest
from django.http import QueryDict

from gpufleet.audit.filters import AuditFilter
from gpufleet.audit.models import AuditEntry, record
from tests.factories import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def entries(operator, alpha, make_fleet):
    other = make_fleet(1)[0]
    record(operator, "claim.create", node=alpha, target="train")
    record(operator, "claim.delete", node=alpha, target="train")
    record(None, "node.diagnose", node=other, target=other.name)
    record(operator, "node.fix", node=alpha, target="cdi")


def _targets(query: str) -> list[str]:
    return [entry.target for entry in AuditFilter(QueryDict(query), queryset=AuditEntry.objects.all()).qs]


def test_it_filters_by_node_and_action_newest_first(entries):
    assert _targets("node=alpha") == ["cdi", "train", "train"]
    assert _targets("action=claim.delete") == ["train"]
    assert _targets("node=alpha&action=node.diagnose") == []
    assert _targets("node=node-00&action=node.diagnose") == ["node-00"]
    assert len(_targets("")) == 4


def test_it_lists_nothing_for_an_unknown_action(entries):
    audit_filter = AuditFilter(QueryDict("node=alpha&action=claim.steal"), queryset=AuditEntry.objects.all())
    assert not audit_filter.is_valid()
    assert list(audit_filter.qs) == []
    assert audit_filter.error_messages() == [
        "action: Select a valid choice. claim.steal is not one of the available choices."
    ]


def test_it_filters_the_page_by_action(viewer_client, entries):
    page = viewer_client.get("/audit/?action=node.fix").content.decode()
    table = page[page.index('id="audit-table"'):]
    assert "<code>node.fix</code>" in table and "<code>claim.create</code>" not in table
    assert '<option value="node.fix" selected>' in page
    assert "No entry matches these filters." in viewer_client.get("/audit/?node=nobody").content.decode()


def test_it_shows_an_unknown_action_at_its_field(viewer_client, entries):
    response = viewer_client.get("/audit/?action=claim.steal")
    page = response.content.decode()
    assert response.status_code == 200
    assert "<code>claim.create</code>" not in page and "Fix the filter values above" in page
    assert (
        '<span id="id_action_error" class="error">Select a valid choice. claim.steal is not one of the available'
        " choices.</span>" in page
    )
    assert "<li>Action: Select a valid choice. claim.steal is not one of the available choices.</li>" in page


def test_it_sends_filter_errors_with_the_htmx_table(viewer_client, entries):
    body = viewer_client.get("/audit/?action=claim.steal", **hx()).content.decode()
    assert body.lstrip().startswith('<div id="audit-table"') and "<html" not in body
    assert "<li>Action: Select a valid choice. claim.steal is not one of the available choices.</li>" in body
    assert '<span id="id_action_error" class="error" hx-swap-oob="true">Select a valid choice.' in body
