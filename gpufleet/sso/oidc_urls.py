"""OpenID Connect login's pages (gpufleet/sso/oidc.py), open to anyone: they are how one logs in."""

from django.contrib.auth.decorators import login_not_required
from django.urls import path

from gpufleet.sso import oidc

app_name = "oidc"

urlpatterns = [
    path("authenticate/", login_not_required(oidc.LoginView.as_view()), name="login"),
    path("callback/", login_not_required(oidc.CallbackView.as_view()), name="callback"),
]
