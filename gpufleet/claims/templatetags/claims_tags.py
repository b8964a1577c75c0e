"""The claims app's pieces on other apps' pages: `{% claims_panel node %}` and
`{% claims_calendar node %}` on the node page, `{% claims_fleet_finding as f %}` for the overview's fleet findings, and
`{{ claim|time_left }}` for claims that end."""

from __future__ import annotations

from django import template
from django.utils import timezone

from gpufleet.claims.summary import missing_devices_finding
from gpufleet.claims.views import claims_panel_context

register = template.Library()


@register.inclusion_tag("claims/node_claims.html", takes_context=True)
def claims_panel(context, node) -> dict:
    request = context["request"]
    return {**claims_panel_context(request, node), "request": request, "access": context.get("access", {})}


@register.inclusion_tag("claims/calendar.html#calendar-slot")
def claims_calendar(node) -> dict:
    """A slot the calendar loads into (claims:calendar): the node page waits for none of it."""
    return {"node": node}


@register.simple_tag
def claims_fleet_finding():
    """Claims that name GPUs their node no longer has, as a fleet finding (or None)."""
    return missing_devices_finding()


@register.filter
def time_left(claim, now=None) -> str:
    """"starts in 2 d" (a booking ahead), "3 h left", "ended 2 d ago", or "" for a
    claim in force with no end."""
    now = now or timezone.now()
    if claim.starts_at is not None and claim.starts_at > now:
        return f"starts in {_span((claim.starts_at - now).total_seconds())}"
    if claim.ends_at is None:
        return ""
    seconds = (claim.ends_at - now).total_seconds()
    span = _span(abs(seconds))
    return f"{span} left" if seconds > 0 else f"ended {span} ago"


def _span(seconds: float) -> str:
    """The largest whole unit: 45 s, 12 min, 3 h, 2 d."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"
