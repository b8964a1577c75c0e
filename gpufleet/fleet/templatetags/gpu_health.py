"""The node page's GPU health cells: temperature, power, ECC and Xid, each in words
and coloured by the doctor's finding for that GPU (so cell and finding agree)."""

from __future__ import annotations

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from gpufleet.core.templatetags.ui import status_badge
from gpufleet.fleet.models import Health

register = template.Library()
_UNKNOWN = mark_safe('<span class="muted">n/a</span>')


def _badge(finding, text: str) -> str:
    return status_badge(Health(finding.status), text) if finding else text


@register.simple_tag
def temperature_cell(device, health: dict) -> str:
    if device.temperature_c is None:
        return _UNKNOWN
    text = f"{device.temperature_c} °C"
    throttled = [r.replace("_", " ") for r in device.throttle_reasons if r != "sw_power_cap"]
    detail = format_html('<span class="sub">{}</span>', ", ".join(throttled)) if throttled else ""
    return format_html("{}{}", _badge(health.get("thermal"), text), detail)


@register.simple_tag
def power_cell(device, health: dict) -> str:
    if device.power_draw_w is None:
        return _UNKNOWN
    text = f"{device.power_draw_w:.0f}"
    text += f" / {device.power_limit_w:.0f} W" if device.power_limit_w else " W"
    return _badge(health.get("power"), text)


@register.simple_tag
def ecc_cell(device, health: dict) -> str:
    finding = health.get("ecc")
    if finding:
        short = "errors" if finding.status == Health.FAIL else "reset pending"
        return format_html('<span title="{}">{}</span>', finding.message, _badge(finding, short))
    mode = device.health.get("ecc_mode")
    if mode is None:
        return _UNKNOWN
    if not mode:
        return "off"
    corrected = device.health.get("ecc_corrected_volatile")
    return format_html("on{}", f" · {corrected} corrected" if corrected else "")


@register.simple_tag
def xid_cell(device, health: dict) -> str:
    if not device.xid_errors:
        return mark_safe('<span class="muted">none</span>')
    listed = format_html_join(
        ", ", '<abbr title="{}">Xid {}</abbr> ×{}', ((x["description"], x["xid"], x["count"]) for x in device.xid_errors)
    )
    finding = health.get("xid")
    if finding and finding.status == Health.OK:
        return format_html('{} <span class="sub">acknowledged</span>', listed)
    return format_html("{} {}", _badge(finding, "Xid"), listed)


@register.filter
def status_is(findings, which: str) -> list:
    """`findings|status_is:"ok"` or `:"problem"` (warn and fail), order kept. A passed
    check is not "ok" while a finding about one aspect of it fails or warns: "gpu2" (its
    memory) is not listed as OK beside a failing "gpu2.thermal"."""
    problems = [f for f in findings if f.status != "ok"]
    if which != "ok":
        return problems
    troubled = {f.code.split(".", 1)[0] for f in problems if "." in f.code}
    return [f for f in findings if f.status == "ok" and f.code not in troubled]
