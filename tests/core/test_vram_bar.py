"""The VRAM bar turns amber where the VRAM finding warns: at GPUFLEET_VRAM_WARN_PERCENT,
read the way the doctor reads it, and not before."""

from __future__ import annotations

import pytest

from gpufleet.core.templatetags.ui import pct_bar, vram_bar

TOTAL = 140 * 1024


def level(html: str) -> str:
    return next(word for word in ("bar-low", "bar-warn", "bar-mid", "bar-high") if word in html)


@pytest.mark.parametrize(("used_percent", "expected"), [(0, "bar-low"), (74, "bar-low"), (89, "bar-low"),
                                                         (90, "bar-warn"), (97, "bar-warn"), (100, "bar-warn")])
def test_it_turns_amber_at_the_warning_level_and_not_before(settings, used_percent, expected):
    settings.GPUFLEET_VRAM_WARN_PERCENT = 90
    assert level(vram_bar(TOTAL * used_percent // 100, TOTAL)) == expected


def test_it_follows_the_setting(settings):
    settings.GPUFLEET_VRAM_WARN_PERCENT = 70
    assert level(vram_bar(TOTAL * 74 // 100, TOTAL)) == "bar-warn"
    assert level(vram_bar(TOTAL * 69 // 100, TOTAL)) == "bar-low"


@pytest.mark.parametrize("ignored", [0, -5, 150, float("nan")])
def test_a_setting_the_doctor_ignores_leaves_the_default(settings, ignored):
    settings.GPUFLEET_VRAM_WARN_PERCENT = ignored
    assert level(vram_bar(TOTAL * 89 // 100, TOTAL)) == "bar-low"
    assert level(vram_bar(TOTAL * 90 // 100, TOTAL)) == "bar-warn"


def test_utilization_has_no_levels(settings):
    settings.GPUFLEET_VRAM_WARN_PERCENT = 10
    assert "bar-neutral" in pct_bar(99)
