"""The one place that says who may do what. Every view, fragment, export and API
endpoint asks `can()` (or uses `@requires`); templates get the same answers as
`access` (see `access_context`)."""

from __future__ import annotations

from functools import wraps

from django.core.exceptions import PermissionDenied

VIEW, EDIT_CLAIMS, DIAGNOSE, APPLY_FIX, MANAGE_USERS = "view", "edit_claims", "diagnose", "apply_fix", "manage_users"
ACKNOWLEDGE_XID = "acknowledge_xid"

_PERMISSION = {
    VIEW: "fleet.view_node",
    EDIT_CLAIMS: "claims.change_claim",
    DIAGNOSE: "fleet.diagnose_node",
    APPLY_FIX: "fleet.apply_fix",
    ACKNOWLEDGE_XID: "fleet.acknowledge_xid",
    MANAGE_USERS: "auth.change_user",
}


def can(user, action: str) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(_PERMISSION[action]))


def can_open_admin(user) -> bool:
    """Django's admin site: staff, as in Django, and the admin role (through its user
    management permission, so no extra query), which manages users there within the
    roles (gpufleet/core/admin.py) and reads the rest."""
    return bool(user and user.is_authenticated and user.is_active and (user.is_staff or can(user, MANAGE_USERS)))


def requires(action: str):
    """View decorator: 403 unless the user may `action` (login is enforced by middleware)."""

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not can(request.user, action):
                raise PermissionDenied(f"your role may not {action.replace('_', ' ')}")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def access_context(request) -> dict:
    """Context processor: `access.edit_claims` etc. (and `access.open_admin`) for hiding
    controls in templates."""
    user = getattr(request, "user", None)
    return {"access": {action: can(user, action) for action in _PERMISSION} | {"open_admin": can_open_admin(user)}}
