"""The fleet pages' own template helpers: `{% health_badge %}` for a health
named in the template and `|toolkit_short`."""

from __future__ import annotations

from django import template

from gpufleet.core.templatetags.ui import status_badge
from gpufleet.fleet.models import Health
from gpufleet.fleet.summary import toolkit_short

register = template.Library()

register.filter("toolkit_short", toolkit_short)


@register.simple_tag
def health_badge(value: str, text: str = "") -> str:
    """`{% health_badge "fail" %}`: the badge of a node health given by its value."""
    return status_badge(Health(value), text)
