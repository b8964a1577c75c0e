"""Template helpers every page uses: `{% status_badge %}`, `|gib`, `{% vram_bar %}`,
`{% pct_bar %}`, `|is_command`, `|json_compact`, `|duration`, `|from_now`, `{% sort_header %}`. Ages use Django's
`|naturaltime`; times ahead use `|from_now`.

Everything here builds HTML with format_html, so stored text is always escaped."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django import template
from django.conf import settings
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.utils import timezone
from django.utils.html import format_html

from gpufleet.gpu.diagnosis import vram_warn_level
from gpufleet.gpu.findings import fix_is_command

register = template.Library()


@register.simple_tag
def status_badge(status, text: str = "") -> str:
    """A status as text plus colour (never colour alone). `status` is a choices
    member with `colour` and `label` (node health, finding status, job status);
    anything else shows as grey text. `text` replaces the label when given."""
    colour, label = getattr(status, "colour", None), getattr(status, "label", None)
    if colour is None or label is None:
        return format_html('<span class="badge badge-grey">{}</span>', text or status or "unknown")
    return format_html('<span class="badge badge-{}">{}</span>', colour, text or label)


@register.filter
def gib(mib) -> str:
    """MiB as GiB with one decimal: 143771 -> "140.4"."""
    if mib is None or mib == "":
        return "?"
    return f"{int(mib) / 1024:.1f}"


def _bar(percent: float | None, text: str, label: str, muted: bool, warn_at: float | None = None) -> str:
    """A bar with its value as text. With `warn_at`, the bar turns amber from that
    percentage (VRAM running out); utilization has no level: busy GPUs are the point.
    The fill is an SVG rect sized by its width attribute, never a style attribute,
    which the Content-Security-Policy forbids."""
    width = 0.0 if percent is None else max(0.0, min(100.0, percent))
    level = "neutral"
    if warn_at is not None and percent is not None:
        level = "warn" if percent >= warn_at else "low"
    return format_html(
        '<span class="bar{}" role="img" aria-label="{}: {}">'
        '<span class="bar-track"><svg class="bar-fill bar-{}" viewBox="0 0 100 1" preserveAspectRatio="none" '
        'aria-hidden="true" focusable="false"><rect width="{}" height="1"/></svg></span>'
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
    """VRAM as a bar with its values in text: "12.0 / 140.4 GiB". Amber where the GPU's
    VRAM finding warns (GPUFLEET_VRAM_WARN_PERCENT, as the doctor reads it)."""
    if not total_mib:
        return format_html('<span class="muted">{}</span>', "no VRAM reported")
    percent = 100.0 * (used_mib or 0) / total_mib
    warn_at = vram_warn_level(settings.GPUFLEET_VRAM_WARN_PERCENT)
    return _bar(percent, f"{gib(used_mib)} / {gib(total_mib)} GiB ({percent:.0f} %)", "VRAM used", muted, warn_at)


@register.simple_tag
def pct_bar(percent, label: str = "Utilization", muted: bool = False) -> str:
    if percent is None:
        return format_html('<span class="muted" title="{}">{}</span>', label, "n/a")
    return _bar(float(percent), f"{float(percent):.0f} %", label, muted)


# `{% if f.fix|is_command %}`: a fix to copy and run, or advice to read (the domain decides).
register.filter("is_command", fix_is_command)


@register.filter
def json_compact(value) -> str:
    """A JSON value on one line, keys sorted (for the audit log's before → after)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@register.filter
def duration(value) -> str:
    """A timedelta in words, to the minute: "15 minutes", "2 hours 5 minutes"."""
    minutes = max(1, round(value.total_seconds() / 60))
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours} hour{'s' if hours != 1 else ''}"] if hours else []
    if minutes:
        parts.append(f"{minutes} minute{'s' if minutes != 1 else ''}")
    return " ".join(parts)


@register.filter
def from_now(value):
    """A time ahead in words, to the nearest minute: "2 hours from now", "1 day 3 hours from now".
    Django's `|naturaltime` drops the part of an hour it is into, so a two-hour silence
    read "an hour from now" a second after it was made. A time past reads as `|naturaltime`."""
    if not isinstance(value, datetime):
        return value
    left = value - timezone.now()
    if left <= timedelta(0):
        return naturaltime(value)
    minutes = round(left.total_seconds() / 60)
    if minutes < 24 * 60:
        return f"{duration(timedelta(minutes=minutes))} from now"
    days, hours = divmod(round(minutes / 60), 24)
    words = f"{days} day{'s' if days != 1 else ''}"
    if hours:
        words += f" {hours} hour{'s' if hours != 1 else ''}"
    return f"{words} from now"


@register.simple_tag(takes_context=True)
def sort_header(context, key: str, label: str, css: str = "") -> str:
    """A sortable column header of a list's table: a real link (works without
    JavaScript) to this page that HTMX follows into the table, keeping the filters,
    back to page 1. Needs `filter` (with `current_sort`) and `query` in the context."""
    current = context["filter"].current_sort
    if current == key:
        target, aria, arrow = f"-{key}", "ascending", "▲"
    elif current == f"-{key}":
        target, aria, arrow = key, "descending", "▼"
    else:
        target, aria, arrow = key, "none", ""
    params = context["query"].copy()
    params["sort"] = target
    params.pop("page", None)
    url = f"{context['request'].path}?{params.urlencode()}"
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
