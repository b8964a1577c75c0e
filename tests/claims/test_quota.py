"""Team quotas enforced where claims are saved: GPUs at once (the peak, not the sum), by
model, GPU-hours per month, GPU-hours ahead, repeating bookings; an admin's override."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.db import connection
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import quota, services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.teams.models import Team
from tests.claims.helpers import NOW, TUESDAY_9, TUESDAY_17, lab_team, make_node
from tests.factories import snapshot

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("monday")]

WEDNESDAY_9 = TUESDAY_9 + timedelta(days=1)
H = timedelta(hours=1)


@pytest.fixture
def team(operator, admin_user):
    team = Team.objects.create(name="vision")
    team.memberships.create(user=operator)
    team.memberships.create(user=admin_user)
    return team


def book(node, name: str, user, team, starts_at=TUESDAY_9, ends_at=TUESDAY_17, count=0, device_ids=(),
         reason=None) -> Claim:
    return services.save_claim(
        node, gpu.Claim(name=name, count=count, device_ids=tuple(device_ids)), user,
        terms=services.Terms(owner=user, starts_at=starts_at, ends_at=ends_at, team=team),
        quota_override_reason=reason,
    )


def limit(team: Team, **quotas) -> Team:
    Team.objects.filter(pk=team.pk).update(**quotas)
    team.refresh_from_db()
    return team


def test_two_bookings_one_after_the_other_fit_a_quota_their_sum_would_not(team, operator):
    limit(team, max_gpus=4)
    alpha, beta = make_node("alpha", 8), make_node("beta", 8)
    book(alpha, "train", operator, team, count=4)
    book(beta, "eval", operator, team, count=4, starts_at=TUESDAY_17, ends_at=WEDNESDAY_9)
    with pytest.raises(services.QuotaExceeded) as refused:
        book(beta, "more", operator, team, count=1, starts_at=TUESDAY_17 - H, ends_at=TUESDAY_17 + H)
    assert refused.value.code == "quota_exceeded"
    assert refused.value.message == (
        "The booking is over the team's quota of 4 GPUs at once: from Tue 8 Dec 16:00 UTC the team holds 4 and the"
        " booking asks 1 more; an admin may book over the quota, saying why.")
    assert not Claim.objects.filter(name="more").exists()


def test_a_pinned_claim_holds_its_gpus_and_a_whole_node_claim_all_of_the_nodes(team, operator):
    limit(team, max_gpus=3)
    two, four = make_node("two", 2), make_node("four", 4)
    book(four, "pinned", operator, team, device_ids=("0", "1"))
    book(two, "after", operator, team, starts_at=TUESDAY_17, ends_at=WEDNESDAY_9)  # 2 GPUs, later: fits
    with pytest.raises(services.QuotaExceeded) as refused:
        book(two, "whole", operator, team)  # the whole node: 2 GPUs beside 2
    assert (refused.value.exceeded.held, refused.value.exceeded.asks) == (2, 2)
    book(four, "one", operator, team, count=1)


def test_gpus_of_a_model_count_against_its_quota(team, operator):
    limit(team, max_gpus_by_model={"A100": 2})
    assert ingest_snapshot(snapshot("a100", 4, name="NVIDIA A100-SXM4-80GB", total_mib=81920)).outcome == "accepted"
    a100 = Node.objects.get(name="a100")
    h200 = make_node("h200", 4)
    book(h200, "h200s", operator, team, count=4)
    book(a100, "a100s", operator, team, count=2)
    with pytest.raises(services.QuotaExceeded) as refused:
        book(a100, "third", operator, team, count=1)
    assert refused.value.message.startswith("The booking is over the team's quota of 2 A100 GPUs at once")


def test_monthly_gpu_hours_count_each_month_part_of_a_booking_against_that_month(team, operator):
    limit(team, gpu_hours_per_month=100)
    node = make_node("alpha", 8)
    new_year = datetime(2026, 12, 31, 12, tzinfo=UTC)
    book(node, "nye", operator, team, count=4, starts_at=new_year, ends_at=new_year + timedelta(days=1))  # 48 + 48
    # December has 52 GPU-hours left, January 52.
    book(node, "dec", operator, team, count=2, starts_at=TUESDAY_9, ends_at=TUESDAY_9 + 26 * H)
    book(node, "jan", operator, team, count=2, starts_at=datetime(2027, 1, 5, tzinfo=UTC),
         ends_at=datetime(2027, 1, 6, 2, tzinfo=UTC))
    with pytest.raises(services.QuotaExceeded) as refused:
        book(node, "one-more", operator, team, count=1, starts_at=datetime(2027, 1, 10, tzinfo=UTC),
             ends_at=datetime(2027, 1, 10, 1, tzinfo=UTC))
    assert "in January 2027 the team has reserved 100 GPU-hours and the booking asks 1 more" in refused.value.message


def test_only_hours_beyond_the_next_24_count_as_ahead(team, operator):
    limit(team, max_gpu_hours_ahead=10)
    node = make_node("alpha", 8)
    book(node, "soon", operator, team, count=4, starts_at=NOW + 2 * H, ends_at=NOW + 6 * H)  # 16, not ahead
    with pytest.raises(services.QuotaExceeded) as refused:
        book(node, "later", operator, team, count=4, starts_at=NOW + timedelta(days=3),
             ends_at=NOW + timedelta(days=3) + 4 * H)
    assert "the team holds 0 such GPU-hours and the booking asks 16 more" in refused.value.message
    book(node, "later", operator, team, count=2, starts_at=NOW + timedelta(days=3),
         ends_at=NOW + timedelta(days=3) + 5 * H)


def test_a_repeating_booking_counts_all_its_occurrences_and_saves_none_over_quota(team, operator):
    limit(team, gpu_hours_per_month=60)  # each Tuesday asks 16: three fit in December, four do not
    node = make_node("alpha", 8)
    terms = services.Terms(owner=operator, starts_at=TUESDAY_9, ends_at=TUESDAY_17, team=team)
    with pytest.raises(services.QuotaExceeded) as refused:
        services.save_series(node, gpu.Claim("lab", count=2), operator, terms, "FREQ=WEEKLY;COUNT=4")
    assert (refused.value.exceeded.held, refused.value.exceeded.asks) == (0, 64)
    assert not Claim.objects.exists()
    made = services.save_series(node, gpu.Claim("lab", count=2), operator, terms, "FREQ=WEEKLY;COUNT=3")
    assert {c.team_id for c in made} == {team.pk}


def test_an_admin_books_over_quota_saying_why_audited_and_kept_on_the_claim(team, admin_user):
    limit(team, max_gpus=1)
    node = make_node("alpha", 8)
    with pytest.raises(services.QuotaExceeded):
        book(node, "big", admin_user, team, count=4)
    saved = book(node, "big", admin_user, team, count=4, reason="  the paper deadline, agreed with the lab  ")
    assert saved.quota_override_reason == "the paper deadline, agreed with the lab"
    entry = AuditEntry.objects.get(action="claim.create", target="big")
    assert entry.after["quota_override_reason"] == "the paper deadline, agreed with the lab"
    # A booking within the quota keeps no reason: there is nothing to explain.
    assert book(node, "small", admin_user, lab_team(), count=1, reason="habit").quota_override_reason == ""


def test_a_series_over_quota_is_booked_by_an_admin_with_the_reason_on_every_occurrence(team, admin_user):
    limit(team, max_gpus=1)
    terms = services.Terms(owner=admin_user, starts_at=TUESDAY_9, ends_at=TUESDAY_17, team=team)
    made = services.save_series(make_node("alpha", 8), gpu.Claim("lab", count=2), admin_user, terms,
                                "FREQ=WEEKLY;COUNT=2", quota_override_reason="the course")
    assert [c.quota_override_reason for c in made] == ["the course", "the course"]


def test_anyone_but_an_admin_giving_a_reason_is_refused_and_nothing_saved(team, operator):
    node = make_node("alpha", 8)
    with pytest.raises(services.OverrideRefused) as refused:
        book(node, "sneaky", operator, team, count=1, reason="I need it")
    assert refused.value.code == "forbidden"
    assert not Claim.objects.exists()
    assert quota.may_override(operator) is False


def test_an_edit_asking_no_more_is_never_refused_after_the_quota_is_lowered(team, operator):
    node = make_node("alpha", 8)
    saved = book(node, "train", operator, team, count=4)
    limit(team, max_gpus=2)
    renamed = services.save_claim(
        node, gpu.Claim("train-v2", count=3), operator, editing=saved, expected_updated_at=saved.updated_at,
        terms=services.Terms(owner=operator, starts_at=TUESDAY_9, ends_at=TUESDAY_17 - H))
    assert renamed.team_id == team.pk  # kept: the terms named none
    with pytest.raises(services.QuotaExceeded):
        services.save_claim(node, gpu.Claim("train-v2", count=3), operator, editing=renamed,
                            expected_updated_at=renamed.updated_at,
                            terms=services.Terms(owner=operator, starts_at=TUESDAY_9, ends_at=TUESDAY_17 + H))


def test_a_claim_of_no_team_has_no_quota(team):
    # Only the system saves a claim of no team (a person's claim is always a team's).
    limit(team, max_gpus=0)
    assert book(make_node("alpha", 8), "free", None, None, count=8).team is None


def test_the_teams_claims_are_read_in_the_same_queries_however_many_nodes_they_are_on(team, operator):
    limit(team, max_gpus=100)
    nodes = [make_node(f"n{i}", 2) for i in range(6)]
    asked = [gpu.Claim("x", count=1, starts_at=TUESDAY_9, ends_at=TUESDAY_17)]

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert quota.exceeded(team, nodes[0], asked) is None
        return len(captured.captured_queries)

    book(nodes[0], "c0", operator, team, count=1)
    few = queries()
    for i, node in enumerate(nodes[1:], start=1):
        book(node, f"c{i}", operator, team, device_ids=("0",))
    assert queries() == few


def test_the_standing_says_what_the_team_holds_now_ahead_and_this_month(team, operator):
    node = make_node("alpha", 8)
    book(node, "now", operator, team, count=2, starts_at=None, ends_at=NOW + 10 * H)
    book(node, "later", operator, team, count=1, starts_at=NOW + timedelta(days=2), ends_at=NOW + timedelta(days=2) + 5 * H)
    standing = quota.standing(team)
    assert (standing.gpus_now, standing.bookings_ahead, standing.gpu_hours_ahead) == (2, 1, 5)
    assert (standing.month_so_far, standing.month_total) == (0, 25)


def test_the_team_page_partial_shows_its_quotas_and_standing(team, operator):
    limit(team, max_gpus=6, max_gpus_by_model={"H200": 4}, max_gpu_hours_ahead=100)
    node = make_node("alpha", 8)
    book(node, "now", operator, team, count=2, starts_at=None, ends_at=NOW + 10 * H)
    book(node, "later", operator, team, count=1, starts_at=NOW + timedelta(days=2), ends_at=NOW + timedelta(days=2) + 5 * H)
    html = render_to_string("teams/_quota.html", quota.team_quota_context(team))
    fields = {k: " ".join(unescape(v).split()) for k, v in re.findall(r'data-field="(\w+)">(.*?)</td>', html, re.S)}
    assert fields == {
        "max_gpus": "6", "gpus_now": "2 held now", "max_gpus_by_model": "4",
        "gpu_hours_per_month": '<span class="muted">no limit</span>',
        "month": "0 reserved so far in December 2026; 25 with its bookings to the month's end",
        "max_gpu_hours_ahead": "100", "ahead": "5 booked ahead, in 1 booking yet to start",
    }
    assert "<th scope=\"row\">H200 GPUs at once</th>" in html
