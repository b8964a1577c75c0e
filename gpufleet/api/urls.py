from functools import wraps

from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponseNotAllowed
from django.urls import URLPattern, re_path
from ninja.openapi.views import default_home

from gpufleet.api.errors import error
from gpufleet.api.views import api

app_name = "api"


def _api_view(view):
    """Every API URL: the API answers a missing login itself (401 JSON), never with the
    login page's redirect, and a wrong method in JSON too."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = ", ".join(sorted(response["Allow"].split(", ")))
            response = error(405, "method_not_allowed", f"{request.method} is not allowed here")
            response["Allow"] = allowed
        return response

    return login_not_required(wrapper)


@login_not_required
def _not_found(request):
    return error(404, "not_found", f"there is no API endpoint {request.path}")


urlpatterns = [
    URLPattern(p.pattern, _api_view(p.callback), p.default_args, p.name)
    for p in api.urls[0]
    # ninja's own root (a bare 404) gives way to ours, which needs a login like the rest.
    if getattr(p.callback, "func", None) is not default_home
]
# Last, and only for paths ending in "/": without the slash, Django's APPEND_SLASH redirect comes first.
urlpatterns.append(re_path(r"^.*/$", _not_found))
