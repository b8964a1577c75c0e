"""`{% node_jobs node %}`: the node page's recent jobs, each polling its status;
`{% dcgm_panel node %}`: its DCGM diagnostics (whether it has DCGM, the buttons, the last run)."""

from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils import timezone

from gpufleet.core.access import RUN_DCGM_DIAG, can
from gpufleet.fleet import maintenance
from gpufleet.gpu import dcgm
from gpufleet.jobs.models import Job, JobKind, JobStatus

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


def last_dcgm_run(node) -> Job | None:
    """The node's latest DCGM diagnostic that finished (with a result or not)."""
    return (node.jobs.filter(kind=JobKind.DCGM_DIAG, status__in=[JobStatus.DONE, JobStatus.FAILED])
            .exclude(result=None).select_related("requested_by").order_by("-finished_at", "-id").first())


@register.inclusion_tag("jobs/dcgm_panel.html", takes_context=True)
def dcgm_panel(context, node) -> dict:
    request = context.get("request")
    return {
        "node": node,
        "info": dcgm.DcgmInfo.from_dict(node.dcgm),
        "last": last_dcgm_run(node),
        "validation": maintenance.validation_of_loaded(node),
        "install_hint": dcgm.INSTALL_HINT,
        "can_run": can(getattr(request, "user", None), RUN_DCGM_DIAG),
        "request": request,
        "csrf_token": context.get("csrf_token"),
    }
