"""The "API tokens" page: a user makes and revokes their own tokens. Plain forms that
POST with CSRF; no JavaScript needed."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from gpufleet.api.forms import TokenForm
from gpufleet.api.models import ApiToken
from gpufleet.core.access import VIEW, requires


# never_cache: the answer to a POST shows a secret that must not linger in any cache.
@never_cache
@require_http_methods(["GET", "POST"])
@requires(VIEW)
def tokens(request: HttpRequest) -> HttpResponse:
    """The user's live tokens and a form for a new one. The new token's secret is shown
    in the answer to that POST, once: it is stored only as a digest."""
    form = TokenForm(request.POST or None)
    created = secret = None
    if request.method == "POST" and form.is_valid():
        created, secret = ApiToken.issue(request.user, form.cleaned_data["name"], form.cleaned_data["scope"])
        form = TokenForm()
    context = {
        "form": form,
        "created": created,
        "secret": secret,
        "tokens": ApiToken.objects.filter(user=request.user, revoked_at__isnull=True),
    }
    return render(request, "api/tokens.html", context)


@require_POST
@requires(VIEW)
def revoke(request: HttpRequest, pk: int) -> HttpResponse:
    # Only the user's own live tokens: anyone else's is "not found", never "forbidden".
    token = get_object_or_404(ApiToken, pk=pk, user=request.user, revoked_at__isnull=True)
    token.revoke(request.user)
    messages.success(request, f"Token {token.name} revoked; requests using it now get 401.")
    return redirect("tokens:list")
