"""The claims editor: the panel on the node page, the fleet-wide list, and the
add/edit/delete actions behind it.

Every action is a POST that returns the re-rendered claims panel to HTMX and
redirects (PRG) without JavaScript; an invalid form re-renders with 200 so HTMX
swaps it. Whether a claim fits is never decided here: the form asks the ledger
through `services`, and `services.save_claim` asks again under the node lock."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import prefetch_related_objects
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import reswap, retarget, trigger_client_event

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import availability, quota, rights, services, use
from gpufleet.claims.filters import ClaimFilter
from gpufleet.claims.forms import ALL, DEVICES, ClaimForm, PlacementForm, SlotForm
from gpufleet.claims.models import Claim, with_current_devices
from gpufleet.claims.placement import RULED_OUT_SHOWN, fleet_placement
from gpufleet.core import downloads
from gpufleet.core.access import VIEW, can, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.core.paging import ListPaginator
from gpufleet.core.querystring import clean_query
from gpufleet.fleet.models import Device, Node
from gpufleet.gpu.availability import FREE

AUDIT_ROWS = 10
LIST_PAGE_SIZE = 50
# The most of a person's claims starting or ending soon that the claims page names.
REMINDERS_SHOWN = 10
PANEL = "claims/node_claims.html"
FORM_PAGE = "claims/claim_form.html"
FORM_PARTIAL = "claim-form"
GONE_PAGE = "claims/claim_gone.html"
CHANGED_EVENT = "claims-changed"
MAX_PREFILLED_DEVICES = 64


def node_url(node: Node) -> str:
    return reverse("fleet:node_detail", kwargs={"name": node.name})


def audit_url(node: Node) -> str:
    return f"{reverse('audit:log')}?{urlencode({'node': node.name})}"


# --- the panel on the node page --------------------------------------------


def claims_panel_context(request, node: Node, form: ClaimForm | None = None, notice: str = "") -> dict:
    """Context for templates/claims/node_claims.html: the node's ledger and claims,
    the add (or given) form for users who may edit, and recent claim audit rows.
    A fixed number of queries whatever the node's GPU or claim count."""
    if not can(request.user, VIEW):
        raise PermissionDenied("your role may not view")
    devices = node.current_devices()
    claims = list(node.claims.all())
    prefetch_related_objects(claims, "team")  # none to read when the node page read them
    now = timezone.now()
    ledger = node.ledger(devices=devices, claims=[c for c in claims if c.in_force(now)])
    person = rights.of_request(request)
    can_book = person.may_book_somewhere()
    if can_book and form is None:
        form = _add_form(request, node, ledger, devices, initial=_new_claim_initial(request),
                         quota_override=quota.may_override(request.user))
    for claim in claims:
        claim.gpus = claim.gpu_names(ledger)
        claim.may_change = person.may_change(claim)
    entries = list(AuditEntry.objects.filter(node=node, action__startswith="claim.")[:AUDIT_ROWS])
    for entry in entries:
        entry.before_text = _describe(entry.before)
        entry.after_text = _describe(entry.after)
    return {
        "node": node,
        "ledger": ledger,
        "claim_rows": claims,
        "claim_form": form if can_book else None,
        "may_book": can_book,
        "claims_notice": notice,
        "claims_audit": entries,
        "claims_audit_url": audit_url(node),
        "claims_panel_url": reverse("claims:panel", args=[node.name]),
    }


@require_GET
@requires(VIEW)
def panel(request: HttpRequest, name: str) -> HttpResponse:
    """The panel alone, for HTMX (the editor's Cancel); people go to the node page."""
    node = get_object_or_404(Node, name=name)
    if not wants_fragment(request):
        return redirect(node_url(node))
    return _panel_response(request, node)


def _panel_response(
    request, node: Node, form: ClaimForm | None = None, notice: str = "", changed: bool = False
) -> HttpResponse:
    response = render(request, PANEL, claims_panel_context(request, node, form=form, notice=notice))
    patch_vary_headers(response, ["HX-Request"])
    if changed:
        # For parts of the node page outside the panel (the device table's holders).
        trigger_client_event(response, CHANGED_EVENT)
    return response


# --- add / edit ------------------------------------------------------------


def _may_book(request) -> None:
    if not rights.of_request(request).may_book_somewhere():
        raise PermissionDenied("you are in no team, so you may read claims but not book them")


def _may_change(request, claim: Claim) -> None:
    """403 unless the person may change `claim`; services.save_claim and delete_claim ask again."""
    if not rights.of_request(request).may_change(claim):
        raise PermissionDenied(rights.release_refusal(rights.of_request(request), claim))


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def add(request: HttpRequest, name: str) -> HttpResponse:
    _may_book(request)
    node = get_object_or_404(Node, name=name)
    return _edit(request, node, None)


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def edit(request: HttpRequest, pk: int) -> HttpResponse:
    claim = Claim.objects.select_related("node", "team").filter(pk=pk).first()
    if claim is None:
        return _missing(request)
    _may_change(request, claim)
    return _edit(request, claim.node, claim)


def _edit(request, node: Node, editing: Claim | None) -> HttpResponse:
    in_panel = _in_panel(request)
    if request.method == "GET":
        form = _form(request, node, editing, initial=_new_claim_initial(request) if editing is None else None,
                     quota_override=quota.may_override(request.user))
        return render_page(request, FORM_PAGE, _form_context(node, form, in_panel), partial=FORM_PARTIAL)

    form = _form(request, node, editing, data=request.POST, quota_override=quota.may_override(request.user))
    if form.is_valid() and form.repeat_rule():
        try:
            made = services.save_series(node, form.proposed(), request.user, form.terms(), form.repeat_rule(),
                                        quota_override_reason=form.override_reason())
        except services.ClaimError as exc:
            form.add_claim_error(exc)
        else:
            return _saved(request, node, in_panel,
                          f"{len(made)} claims added, {made[0].name} to {made[-1].name}: {made[0].describe()} each.")
    elif form.is_valid():
        try:
            claim = services.save_claim(
                node,
                form.proposed(),
                request.user,
                editing=editing,
                expected_updated_at=form.expected_updated_at(),
                terms=form.terms(),
                quota_override_reason=form.override_reason(),
            )
        except services.ClaimGone:
            return _gone(request, node, in_panel)
        except services.ClaimError as exc:
            if isinstance(exc, services.StaleClaim):
                editing.refresh_from_db()
            form.add_claim_error(exc)
        else:
            return _saved(request, node, in_panel, f"Claim {claim.name} {'saved' if editing else 'added'}: {claim.describe()}.")
    # Whatever was refused, the next save follows the user's review of the current claim.
    form.refresh_version = True
    if in_panel and wants_fragment(request):
        return _panel_response(request, node, form=form)
    # No (readable) version token is a broken request rather than a conflict: 400. HTMX
    # above gets 200 whatever the refusal, as htmx 2 does not swap 4xx bodies.
    status = 400 if form.version_refused else 200
    return render(request, FORM_PAGE, _form_context(node, form, in_panel), status=status)


@require_POST
@requires(VIEW)
def validate_new(request: HttpRequest, name: str) -> HttpResponse:
    """Inline validation of the add form: the form partial with the ledger's verdict."""
    _may_book(request)
    node = get_object_or_404(Node, name=name)
    return _validate(request, node, None)


@require_POST
@requires(VIEW)
def validate(request: HttpRequest, pk: int) -> HttpResponse:
    """Inline validation of an edit, against every other claim of the node."""
    claim = get_object_or_404(Claim.objects.select_related("node", "team"), pk=pk)
    _may_change(request, claim)
    return _validate(request, claim.node, claim)


def _validate(request, node: Node, editing: Claim | None) -> HttpResponse:
    form = _form(request, node, editing, data=request.POST, quota_override=quota.may_override(request.user))
    form.is_valid()
    # 200 even when invalid: htmx 2 does not swap 4xx bodies.
    response = render(request, f"{FORM_PAGE}#{FORM_PARTIAL}", _form_context(node, form, _in_panel(request)))
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- delete ----------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the confirmation page (no JavaScript). POST with confirm=yes and the version
    the claim was shown at (updated_at): delete."""
    claim = Claim.objects.select_related("node", "team").filter(pk=pk).first()
    if claim is None:
        return _missing(request)
    _may_change(request, claim)
    node = claim.node
    in_panel = _in_panel(request)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return _confirm_page(request, claim)
    try:
        version = services.parse_version(request.POST.get(services.VERSION_FIELD), action="delete")
        services.delete_claim(claim, request.user, expected_updated_at=version)
    except services.ClaimGone:
        return _gone(request, node, in_panel)
    except (services.StaleClaim, services.VersionRequired, services.NotAllowed) as exc:
        if isinstance(exc, services.StaleClaim):
            claim.refresh_from_db()
        # The panel and the confirmation page both offer the claim's current version again.
        if in_panel and wants_fragment(request):
            return _panel_response(request, node, notice=exc.message)
        status = {services.VersionRequired: 400, services.NotAllowed: 403}.get(type(exc), 200)
        return _confirm_page(request, claim, error=exc.message, status=status)
    done = f"Claim {claim.name} deleted."
    if in_panel and wants_fragment(request):
        return _panel_response(request, node, notice=done, changed=True)
    messages.success(request, done)
    return redirect(node_url(node))


def _confirm_page(request, claim: Claim, error: str = "", status: int = 200) -> HttpResponse:
    context = {"claim": claim, "node": claim.node, "error": error}
    return render(request, "claims/claim_confirm_delete.html", context, status=status)


def _missing(request) -> HttpResponse:
    """The claim in the URL does not exist. A save or delete (or the panel's Edit) came
    from a page that still showed it, so it was deleted meanwhile: say so on the node it
    was on, which those pages send along (`node`). A plain GET is an ordinary 404."""
    if request.method == "GET" and not wants_fragment(request):
        raise Http404("no such claim")
    name = request.POST.get("node") or request.GET.get("node")
    node = Node.objects.filter(name=name).first() if name else None
    return _gone(request, node, _in_panel(request))


def _saved(request, node, in_panel: bool, done: str):
    """After a save: the panel with `done` as its notice, or back to the node page saying it."""
    if in_panel and wants_fragment(request):
        return _panel_response(request, node, notice=done, changed=True)
    messages.success(request, done)
    return redirect(node_url(node))


def _gone(request, node: Node | None, in_panel: bool) -> HttpResponse:
    """Someone deleted the claim meanwhile. HTMX gets the node's panel, refreshed, with
    the notice: 200, since htmx 2 swaps no 4xx (a 404 left the old form on screen and
    said nothing), retargeted at the panel since the Edit link targets the form only. A
    plain post goes back to the node's claims with the message (PRG). With no node to go
    back to, a page saying so with a link to the fleet's claims (404)."""
    text = services.ClaimGone().message
    htmx = in_panel and wants_fragment(request)
    if node is not None:
        if htmx:
            response = _panel_response(request, node, notice=text, changed=True)
            return reswap(retarget(response, "#claims-panel"), "outerHTML")
        messages.warning(request, text)
        return redirect(node_url(node))
    # Without the node, a claim deleted meanwhile and a mistyped URL look the same.
    context = {"message": "This claim was deleted by someone else meanwhile, or never existed.", "back_url": reverse("claims:list")}
    if htmx:
        response = render(request, f"{GONE_PAGE}#claim-gone", context)
        return reswap(retarget(response, "#claims-panel"), "outerHTML")
    return render(request, GONE_PAGE, context, status=404)


# --- the fleet-wide list ---------------------------------------------------


@require_GET
@requires(VIEW)
def claim_list(request: HttpRequest) -> HttpResponse:
    """Every claim in the fleet, filtered by node and searched by claim or node name.
    An invalid filter value lists no claim and is shown at its field and above the
    table, with 200 so HTMX swaps it in."""
    claims = Claim.objects.select_related("node", "created_by", "owner", "team").order_by("node__name", "name")
    claim_filter = ClaimFilter(request.GET, queryset=claims)
    page = ListPaginator(claim_filter.qs, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    page.object_list = list(page.object_list)
    with_current_devices(page.object_list)
    person = rights.of_request(request)
    for claim in page.object_list:
        claim.gpus = claim.gpu_names() if claim.device_ids else []
        claim.may_change = person.may_change(claim)
    query = clean_query(request.GET)
    query.pop("page", None)
    fragment = wants_fragment(request)
    context = {
        "filter": claim_filter,
        "fragment": fragment,
        # The reminders the beat emails, shown to their owner above the list (not refreshed with it).
        "soon": [] if fragment else list(Claim.objects.filter(owner=request.user).soon()
                                         .select_related("node").order_by("starts_at", "pk")[:REMINDERS_SHOWN]),
        "page": page,
        "node_filter": claim_filter.cleaned("node"),
        "q": claim_filter.cleaned("q"),
        "query": query.urlencode(),
        "placement_form": PlacementForm(),
        "may_book": person.may_book_somewhere(),
    }
    return render_page(request, "claims/claim_list.html", context, partial="claims-table")


@require_GET
@requires(VIEW)
def find(request: HttpRequest) -> HttpResponse:
    """Where can N GPUs go now: the fitting nodes best first, and why each other node
    cannot take the claim. A GET form; HTMX gets the answer's partial alone. "Claim
    here" opens the normal claim form, whose save is checked again under the node lock."""
    form = PlacementForm(request.GET if request.GET else None)
    placement = fleet_placement(form.placement_request()) if form.is_valid() else None
    context = {
        "placement_form": form,
        "placement": placement,
        "ruled_out_shown": placement.ruled_out[:RULED_OUT_SHOWN] if placement else [],
        "ruled_out_counts": [
            (code, gpu.PLACEMENT_REASONS.get(code, code), count)
            for code, count in (placement.ruled_out_counts() if placement else {}).items()
        ],
        "whole_node": form.is_valid() and form.cleaned_data["whole_node"],
        "may_book": rights.of_request(request).may_book_somewhere(),
    }
    return render_page(request, "claims/find.html", context, partial="placement-result")


# --- when GPUs are free ------------------------------------------------------


@require_GET
@requires(VIEW)
def calendar(request: HttpRequest, name: str) -> HttpResponse:
    """The node's GPUs over the next days, each claim a bar; a free span opens the claim
    form filled in (in the node page's panel under HTMX). The node page loads it as a
    partial and again after every change of its claims."""
    node = get_object_or_404(Node, name=name)
    now = timezone.now()
    shown = availability.node_calendar(node, now)
    if rights.of_request(request).may_book_somewhere():
        for line in shown.lines:
            if line.uuid:
                line.bars[:] = [replace(bar, book_url=book_url(node.name, [line.uuid], bar.starts_at, bar.ends_at, now))
                                if bar.state == FREE else bar for bar in line.bars]
    context = {"node": node, "calendar": shown, "now": now, "zone": timezone.get_current_timezone_name(),
               "fragment": wants_fragment(request)}
    return render_page(request, "claims/calendar.html", context, partial="node-calendar")


@require_GET
@requires(VIEW)
def fleet_availability(request: HttpRequest) -> HttpResponse:
    """For each GPU model, how many GPUs are free in each hour (or ?step=day) of the next days."""
    step = request.GET.get("step") if request.GET.get("step") in availability.STEPS else availability.STEPS[0]
    edges, counts, as_of = availability.kept_fleet_free(step)
    context = {
        "as_of": as_of,
        "step": step,
        "steps": availability.STEPS,
        "buckets": edges[:-1],
        "models": sorted(counts.items()),
        "days": availability.HORIZON_DAYS,
        "zone": timezone.get_current_timezone_name(),
    }
    return render_page(request, "claims/availability.html", context, partial="availability-table")


@require_GET
@requires(VIEW)
def find_slot(request: HttpRequest) -> HttpResponse:
    """The earliest windows N GPUs of one node are free, best first, each with a link to
    the claim form filled in (checked again by the ledger when saved). A GET form; HTMX
    gets the answer's partial alone."""
    form = SlotForm(request.GET if request.GET else None)
    now = timezone.now()
    slots, as_of = availability.kept_fleet_slots(form.slot_request(now), now) if form.is_valid() else (None, None)
    rows = [(slot, book_url(slot.node, slot.device_ids, slot.starts_at, slot.ends_at, now)) for slot in slots or ()]
    context = {"slot_form": form, "slots": slots, "rows": rows, "as_of": as_of, "zone": timezone.get_current_timezone_name()}
    return render_page(request, "claims/slots.html", context, partial="slot-result")


def book_url(node_name: str, device_ids, starts_at: datetime, ends_at: datetime, now: datetime) -> str:
    """The claim form of the node, filled in with these GPUs and window; a start already
    come is left out (the form's "now")."""
    query = [(DEVICES, device_id) for device_id in device_ids]
    if starts_at > now:
        query.append(("starts_at", timezone.localtime(starts_at).isoformat()))
    query.append(("ends_at", timezone.localtime(ends_at).isoformat()))
    return f"{reverse('claims:add', args=[node_name])}?{urlencode(query)}"


# --- helpers ---------------------------------------------------------------


def _new_claim_initial(request) -> dict:
    """A new claim is owned by whoever adds it; "claim here" (from "find a node"), "book
    this" and the calendar bring the count, every GPU, or the GPUs to pin, and the
    window, along in the query."""
    initial = {"owner": request.user.get_username()}
    if request.GET.get("mode") == ALL:
        initial["mode"] = ALL
    elif request.GET.getlist(DEVICES):
        initial.update(mode=DEVICES, devices=request.GET.getlist(DEVICES)[:MAX_PREFILLED_DEVICES])
    elif request.GET.get("count", "").isdigit() and int(request.GET["count"]) > 0:
        initial["count"] = int(request.GET["count"])
    for field in ("starts_at", "ends_at"):
        moment = _moment(request.GET.get(field, ""))
        if moment is not None:
            initial[field] = timezone.localtime(moment)
    return initial


def _moment(text: str) -> datetime | None:
    """An ISO 8601 time from a link (one without a zone is the site's); None if unreadable."""
    try:
        moment = parse_datetime(text.strip())
    except ValueError:
        return None
    if moment is not None and timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


def _add_form(request, node: Node, ledger: gpu.Ledger, devices: list[Device], data=None, initial=None,
              quota_override: bool = False) -> ClaimForm:
    return ClaimForm(
        data,
        initial=initial,
        user=request.user,
        person=rights.of_request(request),
        node=node,
        ledger=ledger,
        devices=devices,
        action_url=reverse("claims:add", args=[node.name]),
        validate_url=reverse("claims:validate_new", args=[node.name]),
        quota_override=quota_override,
    )


def _form(request, node: Node, editing: Claim | None, data=None, initial=None, quota_override: bool = False) -> ClaimForm:
    devices = node.current_devices()
    ledger = node.ledger(devices=devices)
    if editing is None:
        return _add_form(request, node, ledger, devices, data, initial, quota_override)
    return ClaimForm(
        data,
        user=request.user,
        person=rights.of_request(request),
        node=node,
        ledger=ledger,
        devices=devices,
        editing=editing,
        action_url=reverse("claims:edit", args=[editing.pk]),
        validate_url=reverse("claims:validate", args=[editing.pk]),
        quota_override=quota_override,
    )


def _form_context(node: Node, form: ClaimForm, in_panel: bool) -> dict:
    return {
        "node": node,
        "form": form,
        "ledger": form.ledger,
        "in_panel": in_panel,
        "panel_url": reverse("claims:panel", args=[node.name]),
    }


def _in_panel(request) -> bool:
    return (request.POST.get("in_panel") or request.GET.get("in_panel")) == "1"


def _describe(snapshot: dict | None) -> str:
    if not snapshot:
        return ""
    claim = Claim(
        name=snapshot.get("name", ""), count=snapshot.get("count", 0), device_ids=snapshot.get("device_ids", [])
    )
    return f"{claim.name}: {claim.describe()}"


# --- claims against use ------------------------------------------------------


@require_GET
@requires(VIEW)
def claims_vs_use(request: HttpRequest) -> HttpResponse:
    """Where the claims and the work on the GPUs disagree, fleet-wide: used but
    unclaimed, running outside its claim, claimed but idle (found at ingest)."""
    use_filter = use.UseFilter(request.GET, queryset=use.findings())
    page = ListPaginator(use_filter.qs, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    query = clean_query(request.GET)
    query.pop("page", None)
    context = {
        "filter": use_filter,
        "fragment": wants_fragment(request),
        "page": page,
        "rows": list(zip(page.object_list, use.rows(page.object_list), strict=True)),
        "idle_hours": settings.GPUFLEET_IDLE_HOURS,
        "query": query,
        "query_string": query.urlencode(),
    }
    return render_page(request, "claims/use.html", context, partial="use-table")


@require_GET
@requires(VIEW, tokens=True)
def claims_vs_use_export(request: HttpRequest, fmt: str) -> HttpResponse:
    """The same rows as the page (its filters and sort), all of them, streamed. An
    invalid filter is a 400: a download holding more than was asked would mislead."""
    use_filter = use.UseFilter(request.GET, queryset=use.findings())
    if not use_filter.is_valid():
        lines = ["No export: these filter values are not valid.", *use_filter.error_messages()]
        return HttpResponseBadRequest("\n".join(lines) + "\n", content_type="text/plain; charset=utf-8")
    found = use_filter.qs.iterator(chunk_size=2000)
    body = use.as_json(found) if fmt == "json" else downloads.csv_stream(use.COLUMNS, use.as_csv_rows(found))
    return downloads.download(body, fmt, "gpufleet-claims-vs-use")
