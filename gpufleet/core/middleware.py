"""Login everywhere, except the login page itself and static files.

An HTMX request from an expired session gets HX-Redirect to the login page, so
the login form never lands inside a table cell."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponse
from django.shortcuts import resolve_url


class LoginRequiredHtmxMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.open_prefixes = ("/" + settings.STATIC_URL.lstrip("/"), "/accounts/login/", "/healthz")

    def __call__(self, request):
        if request.user.is_authenticated or request.path.startswith(self.open_prefixes):
            return self.get_response(request)
        login_url = resolve_url(settings.LOGIN_URL)
        if getattr(request, "htmx", False):
            response = HttpResponse(status=204)
            response["HX-Redirect"] = f"{login_url}?next={request.htmx.current_url_abs_path or '/'}"
            return response
        if request.path.startswith("/api/"):
            return HttpResponse('{"error": "login required"}', status=401, content_type="application/json")
        return redirect_to_login(request.get_full_path(), login_url)
