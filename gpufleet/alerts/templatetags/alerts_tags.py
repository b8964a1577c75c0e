"""The alerts app's piece on the overview: `{% failing_channels_finding as f %}`."""

from __future__ import annotations

from django import template

from gpufleet.alerts import services

register = template.Library()


@register.simple_tag
def failing_channels_finding():
    """Channels whose notifications fail every try, as a fleet finding (or None)."""
    return services.failing_channels_finding()
