"""`{% oidc_button %}`: the login page's "Log in with <provider>" button, when OpenID Connect
login is set up (gpufleet/sso/oidc.py); nothing otherwise."""

from __future__ import annotations

from django import template
from django.conf import settings

register = template.Library()


@register.inclusion_tag("registration/oidc_button.html", takes_context=True)
def oidc_button(context) -> dict:
    if not settings.GPUFLEET_OIDC_ISSUER:
        return {}
    return {"provider": settings.GPUFLEET_OIDC_PROVIDER_NAME, "next": context.get("next", ""),
            "password_login": context.get("password_login", False)}
