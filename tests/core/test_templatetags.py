"""The shared template tags (gpufleet.core.templatetags.ui) and the fleet's own."""

from django.template import Context, Template

from gpufleet.core.templatetags.ui import gib, status_badge, vram_bar
from gpufleet.fleet.models import FindingStatus, Health
from gpufleet.fleet.templatetags.fleet_tags import health_badge, toolkit_short
from gpufleet.jobs.models import JobStatus


def test_it_renders_badges_with_text_and_colour():
    assert status_badge(Health.WARN) == '<span class="badge badge-amber">Warning</span>'
    assert status_badge(FindingStatus.FAIL) == '<span class="badge badge-red">Failing</span>'
    assert health_badge("offline") == '<span class="badge badge-grey">Offline</span>'
    assert status_badge(JobStatus.EXPIRED) == '<span class="badge badge-amber">No answer</span>'
    assert health_badge("fail", "Vanished") == '<span class="badge badge-red">Vanished</span>'
    assert status_badge("<b>") == '<span class="badge badge-grey">&lt;b&gt;</span>'


def test_it_ranks_severity_in_one_order():
    assert [s.rank for s in FindingStatus] == [0, 1, 2]
    assert Health.OFFLINE.rank > Health.FAIL.rank > Health.WARN.rank > Health.OK.rank
    assert "offline" not in FindingStatus.values


def test_it_renders_the_badge_tag_in_templates():
    html = Template("{% load ui %}{% status_badge health %}").render(Context({"health": Health.FAIL}))
    assert html == '<span class="badge badge-red">Failing</span>'


def test_it_renders_bars_with_values_in_text():
    html = vram_bar(1024 * 128, 1024 * 140)
    assert "128.0 / 140.0 GiB (91 %)" in html and "bar-warn" in html and '<rect width="91.4"' in html
    assert "style=" not in html  # the policy forbids inline styles
    assert "bar-muted" in vram_bar(1, 2, True)
    assert "no VRAM reported" in vram_bar(0, 0)


def test_it_shortens_versions():
    assert toolkit_short("NVIDIA Container Toolkit CLI version 1.18.2") == "1.18.2"
    assert toolkit_short("custom build") == "custom build"
    assert gib(143771) == "140.4" and gib(None) == "?"


def test_it_says_durations_in_words():
    from datetime import timedelta

    from gpufleet.core.templatetags.ui import duration

    assert duration(timedelta(minutes=15)) == "15 minutes"
    assert duration(timedelta(hours=2, minutes=1)) == "2 hours 1 minute"
    assert duration(timedelta(seconds=5)) == "1 minute"


def test_it_says_how_far_ahead_a_time_is_to_the_nearest_minute():
    from datetime import UTC, datetime, timedelta

    import time_machine

    from gpufleet.core.templatetags.ui import from_now

    now = datetime(2026, 3, 2, 10, 0, 30, tzinfo=UTC)
    with time_machine.travel(now, tick=False):
        # A two-hour silence made at the start of this minute has 1 h 59 min 30 s left.
        assert from_now(now.replace(second=0) + timedelta(hours=2)) == "2 hours from now"
        assert from_now(now + timedelta(minutes=90)) == "1 hour 30 minutes from now"
        assert from_now(now + timedelta(seconds=20)) == "1 minute from now"
        assert from_now(now + timedelta(days=2) - timedelta(seconds=40)) == "2 days from now"
        assert from_now(now + timedelta(days=1, hours=3)) == "1 day 3 hours from now"
        assert from_now(now - timedelta(hours=3)) == "3\xa0hours ago"
