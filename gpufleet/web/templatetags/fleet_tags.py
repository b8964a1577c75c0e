"""Template helpers for gpufleet pages: `{% status_badge %}`, `|age`, `|gib`,
`{% vram_bar %}`, `{% pct_bar %}`, `|toolkit_short`, `{% url_or %}`.

Everything here builds HTML with format_html, so stored text is always escaped."""

from __future__ import annotations

import json
from datetime import datetime

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html

from gpufleet.fleet.models import Health
from gpufleet.jobs.models import JobStatus
from gpufleet.web.summary import toolkit_short

register = template.Library()

_ENUMS = (Health, JobStatus)


def _enum(value):
    if isinstance(value, _ENUMS):
        return value
    for enum in _ENUMS:
        try:
            return enum(value)
        except ValueError:
            continue
    return None


@register.simple_tag
def status_badge(status, text: str = "") -> str:
    """A status as text plus colour (never colour alone): Health or JobStatus,
    or their stored value. `text` replaces the label when given."""
    enum = _enum(status)
    if enum is None:
        return format_html('<span class="badge badge-grey">{}</span>', text or status or "unknown")
    return format_html('<span class="badge badge-{}">{}</span>', enum.colour, text or enum.label)


@register.filter
def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago: "12 s ago", "3 min ago", "5 h ago", "2 d ago"; "never" for None."""
    if value is None:
        return "never"
    seconds = int(((now or timezone.now()) - value).total_seconds())
    if seconds < 1:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


@register.filter
def gib(mib) -> str:
    """MiB as GiB with one decimal: 143771 -> "140.4"."""
    if mib is None or mib == "":
        return "?"
    return f"{int(mib) / 1024:.1f}"


register.filter("toolkit_short", toolkit_short)


def _bar(percent: float | None, text: str, label: str, muted: bool, levels: bool = True) -> str:
    """A bar with its value as text. With `levels`, a fuller bar turns amber then red
    (VRAM running out); utilization has no such levels: busy GPUs are the point."""
    width = 0.0 if percent is None else max(0.0, min(100.0, percent))
    level = "neutral"
    if levels and percent is not None:
        level = "high" if percent >= 90 else "mid" if percent >= 70 else "low"
    return format_html(
        '<span class="bar{}" role="img" aria-label="{}: {}">'
        '<span class="bar-track"><span class="bar-fill bar-{}" style="width: {}%"></span></span>'
        '<span class="bar-text">{}</span></span>',
        " bar-muted" if muted else "",
        label,
        text,
        level,
        f"{width:.1f}",
        text,
    )


@register.simple_tag
def vram_bar(used_mib, total_mib, muted: bool = False) -> str:
    """VRAM as a bar with its values in text: "12.0 / 140.4 GiB"."""
    if not total_mib:
        return format_html('<span class="muted">{}</span>', "no VRAM reported")
    percent = 100.0 * (used_mib or 0) / total_mib
    return _bar(percent, f"{gib(used_mib)} / {gib(total_mib)} GiB ({percent:.0f} %)", "VRAM used", muted)


@register.simple_tag
def pct_bar(percent, label: str = "Utilization", muted: bool = False) -> str:
    if percent is None:
        return format_html('<span class="muted" title="{}">{}</span>', label, "n/a")
    return _bar(float(percent), f"{float(percent):.0f} %", label, muted, levels=False)


@register.simple_tag
def url_or(name: str, fallback: str, *args) -> str:
    """reverse(name) when that URL exists, else `fallback` (for links to pages
    another part of the site adds later)."""
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return fallback


@register.simple_tag(takes_context=True)
def sort_header(context, key: str, label: str, css: str = "") -> str:
    """A sortable column header of the overview table: a real link (works without
    JavaScript) that HTMX follows into the table, keeping the filters, back to page 1."""
    current = context["form"].current_sort
    if current == key:
        target, aria, arrow = f"-{key}", "ascending", "▲"
    elif current == f"-{key}":
        target, aria, arrow = key, "descending", "▼"
    else:
        target, aria, arrow = key, "none", ""
    params = context["query"].copy()
    params["sort"] = target
    params.pop("page", None)
    url = f"{reverse('web:fleet')}?{params.urlencode()}"
    return format_html(
        '<th scope="col" class="{}" aria-sort="{}"><a href="{}" hx-get="{}" hx-push-url="true">{}'
        '<span class="sort-arrow" aria-hidden="true">{}</span></a></th>',
        css,
        aria,
        url,
        url,
        label,
        arrow,
    )


@register.filter
def json_compact(value) -> str:
    """A JSON value on one line, keys sorted (for the audit log's before → after)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
