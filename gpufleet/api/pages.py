"""The "API tokens" page: a user makes and revokes their own tokens, and reads, revokes
and re-issues their calendar feeds' URLs. Plain forms that POST with CSRF; no JavaScript
needed."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from gpufleet.api import feeds
from gpufleet.api.forms import TokenForm
from gpufleet.api.models import ApiToken, CalendarFeed
from gpufleet.core.access import VIEW, requires

# Where a new token's secret waits in the session for the page that shows it, once.
NEW_TOKEN_KEY = "api_new_token"


# never_cache: the page after a creation shows a secret that must not linger in any cache.
@never_cache
@require_http_methods(["GET", "POST"])
@requires(VIEW)
def tokens(request: HttpRequest) -> HttpResponse:
    """The user's live tokens and a form for a new one. A creation redirects back here
    (so a reload makes nothing twice) and this page shows the new secret, once: it is
    stored only as a digest, and kept in the session only until this page pops it."""
    form = TokenForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        created, secret = ApiToken.issue(request.user, form.cleaned_data["name"], form.cleaned_data["scope"])
        request.session[NEW_TOKEN_KEY] = {"name": created.name, "secret": secret}
        return redirect("tokens:list")
    new = request.session.pop(NEW_TOKEN_KEY, {}) if request.method == "GET" else {}
    context = {
        "form": form,
        "created_name": new.get("name"),
        "secret": new.get("secret"),
        "tokens": ApiToken.objects.filter(user=request.user, revoked_at__isnull=True),
        # Issued here on the first visit, as by GET /api/calendar/.
        "feeds": [{"feed": feed, **feeds.as_dict(request, feed)} for feed in feeds.feeds_for(request.user)],
    }
    return render(request, "api/tokens.html", context)


@require_http_methods(["GET", "POST"])
@requires(VIEW)
def revoke(request: HttpRequest, pk: int) -> HttpResponse:
    """GET (or a POST without confirm=yes): the confirmation page. POST with confirm=yes:
    revoke, and back to the list."""
    # Only the user's own live tokens: anyone else's is "not found", never "forbidden".
    token = get_object_or_404(ApiToken, pk=pk, user=request.user, revoked_at__isnull=True)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "api/token_confirm_revoke.html", {"token": token})
    token.revoke(request.user)
    messages.success(request, f"Token {token.name} revoked; requests using it now get 401.")
    return redirect("tokens:list")


@require_POST
@requires(VIEW)
def revoke_feed(request: HttpRequest, pk: int) -> HttpResponse:
    feed = _feed_to_change(request, pk)
    if feed.live:
        feed.revoke(request.user)
    messages.success(request, f"The calendar feed of {feed.subject()} is revoked; its URL now answers 404.")
    return redirect("tokens:list")


@require_POST
@requires(VIEW)
def reissue_feed(request: HttpRequest, pk: int) -> HttpResponse:
    feed = _feed_to_change(request, pk)
    try:
        feed.reissue(request.user)
    except IntegrityError:
        pass  # re-issued by another request at the same moment: its new URL stands
    messages.success(request, f"The calendar feed of {feed.subject()} has a new URL; the old one now answers 404.")
    return redirect("tokens:list")


def _feed_to_change(request: HttpRequest, pk: int) -> CalendarFeed:
    feed = get_object_or_404(CalendarFeed.objects.select_related("user", "team"), pk=pk)
    if not feeds.may_revoke(request.user, feed):
        # A feed the person may not even see is "not found", never "forbidden".
        if not feeds.may_see(request.user, feed):
            raise Http404("no such calendar feed")
        raise PermissionDenied("only the team's leads and the admin role may revoke or re-issue its calendar feed")
    return feed
