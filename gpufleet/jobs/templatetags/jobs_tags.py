"""`{% node_jobs node %}`: the node page's recent jobs, each polling its status."""

from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils import timezone

from gpufleet.jobs.models import Job

register = template.Library()

RECENT_JOBS = timedelta(minutes=15)


def recent_jobs(node, now) -> list[Job]:
    """Jobs still open or asked for in the last minutes: shown (and polled) on the page,
    so a browser without JavaScript sees its request's progress after the redirect."""
    return list(node.jobs.filter(created_at__gte=now - RECENT_JOBS).select_related("node", "requested_by")[:5])


@register.inclusion_tag("jobs/node_jobs.html")
def node_jobs(node) -> dict:
    now = timezone.now()
    return {"jobs": recent_jobs(node, now), "now": now}
