"""The username the login throttle (django-axes) counts attempts under."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model


def throttled_username(request, credentials: dict | None = None) -> str | None:
    """AXES_USERNAME_CALLABLE: the username tried, cut to the longest any account may have.
    django-axes stores it in a 255-character column (PostgreSQL refuses a longer value, a
    500) and the lockout's audit row names it; a longer name is no account's, so attempts
    with it still count, under its first characters."""
    source = credentials if credentials else getattr(request, "data", request.POST)
    username = source.get(settings.AXES_USERNAME_FORM_FIELD)
    if not isinstance(username, str):
        return username
    model = get_user_model()
    return username[: model._meta.get_field(model.USERNAME_FIELD).max_length]
