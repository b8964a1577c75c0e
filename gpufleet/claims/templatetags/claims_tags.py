"""The claims app's pieces on other apps' pages: `{% claims_panel node %}` on the
node page and `{% claims_fleet_finding as f %}` for the overview's fleet findings."""

from __future__ import annotations

from django import template

from gpufleet.claims.summary import missing_devices_finding
from gpufleet.claims.views import claims_panel_context

register = template.Library()


@register.inclusion_tag("claims/node_claims.html", takes_context=True)
def claims_panel(context, node) -> dict:
    request = context["request"]
    return {**claims_panel_context(request, node), "request": request, "access": context.get("access", {})}


@register.simple_tag
def claims_fleet_finding():
    """Claims that name GPUs their node no longer has, as a fleet finding (or None)."""
    return missing_devices_finding()
