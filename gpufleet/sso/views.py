"""The login page (local passwords and LDAP in one form, the OpenID Connect button beside
it) and the page a person single sign-on refused lands on."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.shortcuts import redirect
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_http_methods

from gpufleet.sso.services import REFUSAL_KEY


class SignInView(auth_views.LoginView):
    """Django's login view. A password the directory accepted for a person in no mapped
    group is not a wrong password: that person is sent to the no-access page instead."""

    def get(self, request, *args, **kwargs):
        if REFUSAL_KEY in request.session:
            return redirect("sso:no-access")
        return super().get(request, *args, **kwargs)

    def form_invalid(self, form):
        if REFUSAL_KEY in self.request.session:
            return redirect("sso:no-access")
        return super().form_invalid(form)

    def get_context_data(self, **kwargs):
        # The form takes directory passwords when LDAP is set up, else local ones, which
        # with GPUFLEET_LOCAL_LOGIN=false only the break-glass superuser still has.
        passwords = settings.GPUFLEET_LOCAL_LOGIN or bool(getattr(settings, "GPUFLEET_LDAP_URI", ""))
        return {**super().get_context_data(**kwargs), "password_login": passwords}


@method_decorator(login_not_required, name="dispatch")
class NoAccessView(auth_views.TemplateView):
    template_name = "registration/no_access.html"

    def get_context_data(self, **kwargs):
        refusal = self.request.session.get(REFUSAL_KEY) or {}
        return {**super().get_context_data(**kwargs), "refusal": refusal, "contact": settings.GPUFLEET_SSO_CONTACT}


@login_not_required
@require_http_methods(["POST"])
def try_again(request):
    """Forget the refusal, so the next login (or the proxy's next request) asks the directory again."""
    request.session.pop(REFUSAL_KEY, None)
    return redirect("login")


no_access = NoAccessView.as_view()
