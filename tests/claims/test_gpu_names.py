"""A claim's GPUs are named as the node page names them, "GPU 3" with its UUID beside,
on the claims list and in the emails that speak of the claim; a GPU the node no longer
reports keeps the id it was claimed by."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet.alerts import services as alerts
from gpufleet.alerts.models import Channel, Rule
from gpufleet.claims.models import Claim
from gpufleet.events.models import Kind
from gpufleet.usage import idle
from tests.claims.helpers import claim, make_node, shrink_node, uuid
from tests.usage.owner_mail import mail_fixture  # noqa: F401 (the mail fixture)

pytestmark = pytest.mark.django_db


def _reserves(html: str) -> list[str]:
    """The Reserves cell of each row, tags and spacing taken out."""
    cells = re.findall(r'<td data-label="Reserves">(.*?)</td>', html, re.S)
    return [" ".join(re.sub(r"<[^>]+>", "", cell).split()) for cell in cells]


def test_the_claims_list_names_pinned_gpus_by_index_with_the_uuid_beside(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, device_ids=[uuid(node, 3), uuid(node, 1)])
    claim(node, "eval", operator, device_ids=["7"])
    html = viewer_client.get("/claims/").content.decode()
    assert _reserves(html) == ["GPU 7", "GPU 3, GPU 1"]
    assert f'title="{uuid(node, 3)}">GPU 3</span>' in html and f'title="{uuid(node, 7)}">GPU 7</span>' in html
    assert f">{uuid(node, 3)}" not in html


def test_a_gpu_the_node_no_longer_reports_keeps_its_claimed_id(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, device_ids=[uuid(node, 7), uuid(node, 2)])
    shrink_node(node, 4)
    html = viewer_client.get("/claims/").content.decode()
    assert _reserves(html)[0].startswith(f"{uuid(node, 7)} (missing), GPU 2")


def test_the_idle_mail_and_its_alert_name_the_gpus_by_index(settings, mail, operator):
    settings.GPUFLEET_ALERT_GROUP_S = 0
    operator.email = "otto@example.com"
    operator.save()
    node = make_node("alpha", 4)
    rule = Rule.objects.create(name="idle claims", kinds=[Kind.CLAIM_IDLE], min_severity="info", wait_minutes=0)
    rule.channels.set([Channel.objects.create(name="email", url=mail.url, redacted="mailto://…")])
    train = claim(node, "train", operator, device_ids=[uuid(node, 1), uuid(node, 3)])
    Claim.objects.filter(pk=train.pk).update(idle_since=timezone.now() - timedelta(hours=2))
    idle.run()
    alerts.run_once()
    owner_mail, alert_mail = mail.text(0), mail.text(1)
    for text in (owner_mail, alert_mail):
        assert "Claim 'train' (GPU 1, GPU 3) on alpha has done no work since" in text
        assert uuid(node, 1) not in text
