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


def test_node_enrolment_rotation_and_revocation_can_be_selected(viewer_client):
    from gpufleet.fleet import credentials

    credentials.enroll("gpu-07")
    credentials.enroll("gpu-07", rotate=True)
    credentials.revoke("gpu-07")
    assert _targets("action=node.enroll") == ["gpu-07"]
    assert _targets("action=node.rotate_key") == ["gpu-07"]
    assert _targets("action=node.revoke_key") == ["gpu-07"]
    page = viewer_client.get("/audit/?action=node.revoke_key").content.decode()
    assert '<option value="node.revoke_key" selected>' in page
    assert '<option value="node.enroll">' in page and '<option value="node.rotate_key">' in page


def _written_actions() -> set[str]:
    """Every action the code hands to `record(...)`: a literal, a member of `Action`, or
    the literals assigned to the name it passes (`action = "claim.update" if ... else
    "claim.create"`)."""
    import ast
    from pathlib import Path

    import gpufleet
    from gpufleet.audit.models import Action

    found = set()
    for path in Path(gpufleet.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        strings_of: dict[str, set[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                texts = {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        strings_of.setdefault(target.id, set()).update(texts)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "record" and len(node.args) >= 2:
                action = node.args[1]
                if isinstance(action, ast.Constant) and isinstance(action.value, str):
                    found.add(action.value)
                elif isinstance(action, ast.Name):
                    found |= strings_of.get(action.id, set())
                elif isinstance(action, ast.Attribute) and getattr(action.value, "id", None) == "Action":
                    found.add(Action[action.attr].value if action.attr in Action.names else f"Action.{action.attr}")
    return found


def test_every_action_the_code_writes_is_a_choice_of_the_filter():
    from gpufleet.audit.models import Action

    written = _written_actions()
    assert {"claim.create", "node.enroll", "node.rotate_key", "node.revoke_key", "login.lockout"} <= written
    # The admin site's user and group changes are named "<model>.<create|update|delete>".
    written |= {f"{model}.{change}" for model in ("user", "group") for change in ("create", "update", "delete")}
    choices = dict(AuditFilter().filters["action"].extra["choices"])
    assert written <= set(choices), written - set(choices)
    assert set(choices) == set(Action.values)


def test_an_action_that_is_not_a_choice_is_never_written():
    with pytest.raises(ValueError, match="claim.steal"):
        record(None, "claim.steal", target="x")
    assert not AuditEntry.objects.exists()
