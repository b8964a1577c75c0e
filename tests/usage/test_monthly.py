"""Monthly usage reports: once last month is rolled, each owner gets their month by claim
by email (a real SMTP server on loopback), and the admins' alert channels the fleet's
month (by owner, totals, unknown hours) as a usage-report event (a real HTTP receiver);
once per month however often the beat runs, and what was sent is kept."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
import time_machine

from gpufleet import gpu
from gpufleet.alerts import services as alerts
from gpufleet.alerts.models import Channel, Rule
from gpufleet.claims import services as claims
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event, Kind
from gpufleet.fleet.models import Node
from gpufleet.teams.models import Team
from gpufleet.usage import monthly, rollup, tasks
from gpufleet.usage.models import MonthlyReport
from tests.claims.helpers import save_owned
from tests.usage.owner_mail import SITE, STEP, mail_fixture, port_of, quiet  # noqa: F401 (the mail fixture)

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 31, 20, 55, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)


def at(moment: datetime):
    return time_machine.travel(moment, tick=False)


@pytest.fixture
def march(settings, operator, viewer):
    """The last hours of March: otto's claim on alpha (team vision) busy 3 GPU-hours, vera's on
    beta (in no team) idle 2 GPU-hours, after which beta stopped reporting for its last hour
    (1 unknown GPU-hour)."""
    settings.GPUFLEET_COLLECT_INTERVAL = int(STEP.total_seconds())
    operator.email = "otto@example.com"
    operator.save()
    with at(START):
        quiet("alpha", 2, START, busy=True)
        quiet("beta", 1, START)
        train = claims.save_claim(Node.objects.get(name="alpha"), gpu.Claim("train", count=1), operator)
        Claim.objects.filter(pk=train.pk).update(team=Team.objects.create(name="vision"))
        notebooks = save_owned(Node.objects.get(name="beta"), gpu.Claim("notebooks", count=1), viewer)
        Claim.objects.filter(pk=notebooks.pk).update(team=None)  # a claim of no team, as from before teams
    moment = START + STEP
    while moment < APRIL:
        with at(moment):
            quiet("alpha", 2, moment, busy=True)
            if moment < START + timedelta(hours=2, minutes=5):
                quiet("beta", 1, moment)
        moment += STEP


@pytest.fixture
def admins(settings, webhook):
    """A rule sending usage reports to the admins' webhook."""
    settings.GPUFLEET_ALERT_GROUP_S = 0
    settings.GPUFLEET_SITE_URL = SITE
    rule = Rule.objects.create(name="monthly usage", kinds=[Kind.USAGE_REPORT], min_severity="info", wait_minutes=0,
                               created_at=START)
    rule.channels.set([Channel.objects.create(name="admins", url=webhook.url, redacted="json://…")])
    return webhook


def test_the_month_is_reported_to_each_owner_and_to_the_admins_once(march, mail, admins):
    with at(APRIL + timedelta(minutes=1)):
        assert tasks.monthly_reports() == 0  # its last hour is not rolled yet
        assert not MonthlyReport.objects.exists()
    with at(APRIL + timedelta(minutes=5)):
        rollup.roll()
        assert rollup.rolled_until() == APRIL
        assert tasks.monthly_reports() == 1
        alerts.run_once()

    (message,) = mail.messages
    assert (message["To"], message["Subject"]) == ("otto@example.com", "gpufleet: your GPU usage in March 2026")
    text = mail.text(0)
    assert "GPU usage of your claims in March 2026 (2026-03-01 to 2026-03-31, UTC)." in text
    assert "Reserved 3.0 GPU-hours, of which 0.0 idle (efficiency 100%)." in text
    assert "- train on alpha: 3.0 / 3.0 / 0.0, efficiency 100%" in text
    assert "notebooks" not in text  # vera's
    assert f"{SITE}/usage/?by=claim&owner=otto&from=2026-03-01&to=2026-03-31" in text

    assert admins.titles() == ["gpufleet: Fleet GPU usage, March 2026"]
    summary = admins.posts[0]["message"]
    assert "Reserved 5.0 GPU-hours, of which 2.0 idle (efficiency 60%)." in summary
    assert "Unknown 1.0 GPU-hours: nodes not reporting, neither used nor idle." in summary
    assert "- otto: 3.0 / 3.0 / 0.0, efficiency 100%" in summary
    assert "- vera: 2.0 / 0.0 / 2.0, efficiency 0%" in summary
    # alpha's busy GPU in the five minutes before its claim: used, held by no claim.
    assert "Used 3.1 GPU-hours, of which 0.1 on GPUs no claim held." in summary
    assert "- no owner (GPUs no claim held, claims of nobody): 0.0 / 0.1 / 0.0" in summary
    assert "By team (GPU-hours reserved / used / idle):\n- vision: 3.0 / 3.0 / 0.0, efficiency 100%\n" \
           "- no team (GPUs no claim held, claims in no team): 2.0 / 0.1 / 2.0, efficiency 0%\n" in summary
    event = Event.objects.get(kind=Kind.USAGE_REPORT)
    assert (event.node, event.code, event.severity, event.message) == (None, "2026-03", "info", summary)

    # What was made is kept: vera has no address, so hers is kept unsent.
    kept = {(r.kind, r.recipient): r for r in MonthlyReport.objects.all()}
    assert set(kept) == {("fleet", ""), ("owner", "otto"), ("owner", "vera")}
    assert kept["owner", "otto"].body == text.replace("\r\n", "\n") and kept["owner", "otto"].sent_at is not None
    assert (kept["owner", "vera"].email, kept["owner", "vera"].sent_at) == ("", None)
    assert all(r.month == date(2026, 3, 1) for r in kept.values())

    # The beat runs on: nothing more for March.
    for minutes in (10, 60, 60 * 24 * 3):
        with at(APRIL + timedelta(minutes=minutes)):
            assert tasks.monthly_reports() == 0
            alerts.run_once()
    assert len(mail.messages) == 1 and len(admins.posts) == 1
    assert MonthlyReport.objects.count() == 3 and Event.objects.filter(kind=Kind.USAGE_REPORT).count() == 1


def test_an_owner_email_the_server_refused_is_tried_again_on_the_next_ticks(march, mail, settings):
    with at(APRIL + timedelta(minutes=5)):
        rollup.roll()
    settings.EMAIL_PORT = port_of(mail) + 1 if port_of(mail) < 65535 else port_of(mail) - 1  # nothing listens
    with at(APRIL + timedelta(minutes=10)):
        assert monthly.run() == 0
    failed = MonthlyReport.objects.get(recipient="otto")
    assert failed.tries == 1 and failed.sent_at is None and "ConnectionRefusedError" in failed.error

    settings.EMAIL_PORT = port_of(mail)
    with at(APRIL + timedelta(minutes=15)):
        assert monthly.run() == 1
    sent = MonthlyReport.objects.get(recipient="otto")
    assert (sent.tries, sent.error) == (2, "") and sent.sent_at is not None
    assert mail.subjects() == ["gpufleet: your GPU usage in March 2026"]


def test_an_owner_email_is_given_up_after_three_tries(march, mail, settings):
    with at(APRIL + timedelta(minutes=5)):
        rollup.roll()
    settings.EMAIL_PORT = port_of(mail) + 1 if port_of(mail) < 65535 else port_of(mail) - 1
    for minutes in (10, 15, 20, 25):
        with at(APRIL + timedelta(minutes=minutes)):
            monthly.run()
    assert MonthlyReport.objects.get(recipient="otto").tries == monthly.MAX_TRIES
    assert mail.messages == []


def test_a_month_nobody_used_is_recorded_and_says_nothing(mail, admins):
    with at(APRIL + timedelta(days=1, minutes=1)):
        assert monthly.run() == 0  # not rolled, but a day late: reported as it stands
        alerts.run_once()
    fleet = MonthlyReport.objects.get()
    assert (fleet.kind, fleet.sent_at) == ("fleet", None)
    assert mail.messages == [] and admins.posts == [] and not Event.objects.exists()


def test_the_task_is_on_the_central_beat():
    from django.conf import settings as live

    entry = next(e for e in live.CELERY_BEAT_SCHEDULE.values()
                 if e["task"] == "gpufleet.usage.tasks.monthly_reports")
    assert entry["schedule"] > 0
