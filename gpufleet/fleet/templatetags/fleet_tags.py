"""The fleet pages' own template helpers: `{% health_badge %}` for a health
named in the template, `|toolkit_short`, and the overview's `{% sort_header %}`."""

from __future__ import annotations

from django import template
from django.urls import reverse
from django.utils.html import format_html

from gpufleet.core.templatetags.ui import status_badge
from gpufleet.fleet.models import Health
from gpufleet.fleet.summary import toolkit_short

register = template.Library()

register.filter("toolkit_short", toolkit_short)


@register.simple_tag
def health_badge(value: str, text: str = "") -> str:
    """`{% health_badge "fail" %}`: the badge of a node health given by its value."""
    return status_badge(Health(value), text)


@register.simple_tag(takes_context=True)
def sort_header(context, key: str, label: str, css: str = "") -> str:
    """A sortable column header of the overview table: a real link (works without
    JavaScript) that HTMX follows into the table, keeping the filters, back to page 1."""
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
    url = f"{reverse('fleet:overview')}?{params.urlencode()}"
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


