"""Login everywhere (Django's LoginRequiredMiddleware; the few open views say so
with @login_not_required; the JSON API checks its own login and answers 401 JSON).
An HTMX request from an expired session gets HX-Redirect to the login page, so
the login form never lands inside a table cell."""

from __future__ import annotations

from django.contrib.auth.middleware import LoginRequiredMiddleware
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


class LoginRequiredHtmxMiddleware(LoginRequiredMiddleware):
    def handle_no_permission(self, request, view_func):
        if getattr(request, "htmx", False):
            login_url = resolve_url(self.get_login_url(view_func))
            return HttpResponseClientRedirect(f"{login_url}?next={request.htmx.current_url_abs_path or '/'}")
        return super().handle_no_permission(request, view_func)
