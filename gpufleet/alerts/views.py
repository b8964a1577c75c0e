"""The alert pages: Channels, Rules, Silences (each a list with its form; the admin role
edits, every role reads) and Deliveries (a list). Plain forms that POST with CSRF and
redirect after a change; "Send a test" answers HTMX with the result alone."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpufleet.alerts import services
from gpufleet.alerts.forms import ChannelForm, DeliveryFilterForm, RuleForm, SilenceForm
from gpufleet.alerts.models import Channel, Delivery, Rule, Silence
from gpufleet.core.access import MANAGE_ALERTS, VIEW, can, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.core.querystring import clean_query

DELIVERIES_PAGE_SIZE = 50
ENDED_SILENCES_SHOWN = 20


def _refuse_unless_admin(request: HttpRequest) -> None:
    """The lists take their add form's POST: the admin role's alone."""
    if request.method == "POST" and not can(request.user, MANAGE_ALERTS):
        raise PermissionDenied("your role may not manage alerts")


# --- channels --------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def channel_list(request: HttpRequest) -> HttpResponse:
    """Every channel (its URL as its scheme alone), whether it is failing, and the form
    for a new one (admins)."""
    _refuse_unless_admin(request)
    form = ChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        channel = services.save_channel(request.user, form.cleaned_data["name"], form.cleaned_data["url"],
                                        format=form.cleaned_data["format"])
        messages.success(request, f"Channel {channel.name} added. Send it a test, then give it to a rule.")
        return redirect("alerts:channels")
    # Ordered here: Django leaves Meta.ordering out of a query with GROUP BY.
    rows = Channel.objects.annotate(rule_count=Count("rules")).order_by("name")
    return render(request, "alerts/channels.html", {"channels": rows, "form": form})


@require_http_methods(["GET", "POST"])
@requires(MANAGE_ALERTS)
def channel_edit(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    form = ChannelForm(request.POST or None, editing=channel, initial={"name": channel.name, "format": channel.format})
    if request.method == "POST" and form.is_valid():
        services.save_channel(request.user, form.cleaned_data["name"], form.cleaned_data["url"], editing=channel,
                              format=form.cleaned_data["format"])
        messages.success(request, f"Channel {channel.name} saved.")
        return redirect("alerts:channels")
    return render(request, "alerts/edit.html", {"form": form, "what": "channel", "object": channel,
                                                "back": "alerts:channels"})


@require_http_methods(["GET", "POST"])
@requires(MANAGE_ALERTS)
def channel_delete(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        rules = list(channel.rules.values_list("name", flat=True))
        return render(request, "alerts/confirm_delete.html", {
            "what": "channel", "object": channel, "back": "alerts:channels",
            "consequence": f"Rules that send to it ({', '.join(rules)}) stop sending there." if rules else
            "No rule sends to it.",
        })
    services.delete_channel(request.user, channel)
    messages.success(request, f"Channel {channel.name} deleted.")
    return redirect("alerts:channels")


@require_POST
@requires(MANAGE_ALERTS)
def channel_test(request: HttpRequest, pk: int) -> HttpResponse:
    """Send a test notification now: HTMX gets the result in place, a plain POST a
    message on the Channels page."""
    channel = get_object_or_404(Channel, pk=pk)
    outcome = services.send_test(channel)
    if wants_fragment(request):
        return render(request, "alerts/channels.html#test-result", {"channel": channel, "outcome": outcome})
    if outcome.sent:
        messages.success(request, f"Test sent to {channel.name}.")
    else:
        messages.error(request, f"The test to {channel.name} failed: {outcome.error}")
    return redirect("alerts:channels")


# --- rules -----------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def rule_list(request: HttpRequest) -> HttpResponse:
    _refuse_unless_admin(request)
    form = RuleForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        rule = _save_rule(request, form, None)
        messages.success(request, f"Rule {rule.name} added.")
        return redirect("alerts:rules")
    rules = Rule.objects.prefetch_related("channels")
    context = {"rules": rules, "form": form, "group_s": f"{settings.GPUFLEET_ALERT_GROUP_S:g}"}
    return render(request, "alerts/rules.html", context)


@require_http_methods(["GET", "POST"])
@requires(MANAGE_ALERTS)
def rule_edit(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(Rule, pk=pk)
    form = RuleForm(request.POST or None, instance=rule)
    if request.method == "POST" and form.is_valid():
        _save_rule(request, form, Rule.objects.prefetch_related("channels").get(pk=pk))
        messages.success(request, f"Rule {form.cleaned_data['name']} saved.")
        return redirect("alerts:rules")
    return render(request, "alerts/edit.html", {"form": form, "what": "rule", "object": rule, "back": "alerts:rules"})


def _save_rule(request: HttpRequest, form: RuleForm, editing: Rule | None) -> Rule:
    values = {field: form.cleaned_data[field] for field in services.RULE_FIELDS}
    return services.save_rule(request.user, values, list(form.cleaned_data["channels"]), editing=editing)


@require_http_methods(["GET", "POST"])
@requires(MANAGE_ALERTS)
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(Rule.objects.prefetch_related("channels"), pk=pk)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "alerts/confirm_delete.html", {
            "what": "rule", "object": rule, "back": "alerts:rules",
            "consequence": "Its events are no longer sent; what it sent stays listed under Deliveries.",
        })
    services.delete_rule(request.user, rule)
    messages.success(request, f"Rule {rule.name} deleted.")
    return redirect("alerts:rules")


# --- silences --------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def silence_list(request: HttpRequest) -> HttpResponse:
    """Active and coming silences, the last ones ended, and the form for a new one."""
    _refuse_unless_admin(request)
    form = SilenceForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        silence = services.save_silence(request.user, data["nodes"], data["starts_at"], data["ends_at"],
                                        data["reason"])
        messages.success(request, f"Nodes {silence.nodes} silenced until {timezone.localtime(silence.ends_at):%Y-%m-%d %H:%M}.")
        return redirect("alerts:silences")
    now = timezone.now()
    context = {
        "current": Silence.objects.filter(ends_at__gt=now).order_by("starts_at", "id"),
        "ended": Silence.objects.filter(ends_at__lte=now).order_by("-ends_at", "-id")[:ENDED_SILENCES_SHOWN],
        "form": form,
        "now": now,
    }
    return render(request, "alerts/silences.html", context)


@require_POST
@requires(MANAGE_ALERTS)
def silence_end(request: HttpRequest, pk: int) -> HttpResponse:
    silence = get_object_or_404(Silence, pk=pk)
    services.end_silence(request.user, silence)
    messages.success(request, f"The silence of {silence.nodes} ended.")
    return redirect("alerts:silences")


# --- deliveries ------------------------------------------------------------------------


@require_GET
@requires(VIEW)
def delivery_list(request: HttpRequest) -> HttpResponse:
    """Every notification, newest first, filtered by status and channel; HTMX gets the
    table alone."""
    form = DeliveryFilterForm(request.GET or None)
    rows = Delivery.objects.select_related("silence").annotate(event_count=Count("events")).order_by("-created_at",
                                                                                                    "-id")
    if form.is_valid():
        if form.cleaned_data["status"]:
            rows = rows.filter(status=form.cleaned_data["status"])
        if form.cleaned_data["channel"]:
            rows = rows.filter(channel=form.cleaned_data["channel"])
    page = Paginator(rows, DELIVERIES_PAGE_SIZE).get_page(request.GET.get("page"))
    query = clean_query(request.GET)
    query.pop("page", None)
    context = {"form": form, "page": page, "query": query.urlencode(), "failing": services.failing_channels()}
    return render_page(request, "alerts/deliveries.html", context, partial="deliveries-table")
