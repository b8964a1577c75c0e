"""Login everywhere (Django's LoginRequiredMiddleware; the few open views say so
with @login_not_required; the JSON API checks its own login and answers 401 JSON).
An HTMX request from an expired session gets HX-Redirect to the login page, so
the login form never lands inside a table cell."""

from __future__ import annotations

from django.contrib.auth.middleware import LoginRequiredMiddleware
from django.core.exceptions import BadRequest
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


class LoginRequiredHtmxMiddleware(LoginRequiredMiddleware):
    def handle_no_permission(self, request, view_func):
        if getattr(request, "htmx", False):
            login_url = resolve_url(self.get_login_url(view_func))
            return HttpResponseClientRedirect(f"{login_url}?next={request.htmx.current_url_abs_path or '/'}")
        return super().handle_no_permission(request, view_func)


class RefuseNulMiddleware:
    """A NUL character in a query parameter or a form field, name or value, is a 400 before
    any view runs. PostgreSQL refuses NUL in text, so every view, filter or admin list that
    looked something up with one answered 500; Django's form fields refuse it, but not
    every lookup goes through a form, and no field of the site may hold one."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        for params in (request.GET, request.POST):
            for key, values in params.lists():
                if "\x00" in key or any("\x00" in value for value in values):
                    raise BadRequest("a query parameter or form field holds a NUL character")
        return self.get_response(request)
