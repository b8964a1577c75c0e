"""gpufleet.web.templatetags.fleet_tags: badges, ages, bars."""

from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from gpufleet.fleet.models import Health
from gpufleet.jobs.models import JobStatus
from gpufleet.web.templatetags.fleet_tags import age, gib, status_badge, toolkit_short, vram_bar

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "delta,text",
    [
        (timedelta(0), "just now"),
        (timedelta(seconds=12), "12 s ago"),
        (timedelta(minutes=3, seconds=30), "3 min ago"),
        (timedelta(hours=5), "5 h ago"),
        (timedelta(days=2, hours=3), "2 d ago"),
        (timedelta(seconds=-30), "just now"),  # agent clock ahead
    ],
)
def test_it_says_how_long_ago(delta, text):
    assert age(NOW - delta, NOW) == text


def test_it_says_never_for_no_time():
    assert age(None) == "never"


def test_it_renders_badges_with_text_and_colour():
    assert status_badge(Health.WARN) == '<span class="badge badge-amber">Warning</span>'
    assert status_badge("offline") == '<span class="badge badge-grey">Offline</span>'
    assert status_badge(JobStatus.EXPIRED) == '<span class="badge badge-amber">No answer</span>'
    assert status_badge("fail", "Vanished") == '<span class="badge badge-red">Vanished</span>'
    assert status_badge("<b>") == '<span class="badge badge-grey">&lt;b&gt;</span>'


def test_it_renders_the_badge_tag_in_templates():
    html = Template("{% load fleet_tags %}{% status_badge health %}").render(Context({"health": Health.FAIL}))
    assert html == '<span class="badge badge-red">Failing</span>'


def test_it_renders_bars_with_values_in_text():
    html = vram_bar(1024 * 128, 1024 * 140)
    assert "128.0 / 140.0 GiB (91 %)" in html and "bar-high" in html and 'style="width: 91.4%"' in html
    assert "bar-muted" in vram_bar(1, 2, True)
    assert "no VRAM reported" in vram_bar(0, 0)


def test_it_shortens_versions():
    assert toolkit_short("NVIDIA Container Toolkit CLI version 1.18.2") == "1.18.2"
    assert toolkit_short("custom build") == "custom build"
    assert gib(143771) == "140.4" and gib(None) == "?"
