"""The one place that says who may do what. Every view, fragment, export and API
endpoint asks `can()` (or uses `@requires`); templates get the same answers as
`access` (see `access_context`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

VIEW, EDIT_CLAIMS, DIAGNOSE, APPLY_FIX, MANAGE_USERS = "view", "edit_claims", "diagnose", "apply_fix", "manage_users"
ACKNOWLEDGE_XID = "acknowledge_xid"
MANAGE_ALERTS = "manage_alerts"
MAINTAIN = "maintain"
RUN_DCGM_DIAG = "run_dcgm_diag"

# EDIT_CLAIMS is the operator role's: it changes every claim of the teams they are
# members of, not every claim; who may book and change which claim is said by
# gpufleet/claims/rights.py alone, which reads it.
_PERMISSION = {
    VIEW: "fleet.view_node",
    EDIT_CLAIMS: "claims.change_claim",
    DIAGNOSE: "fleet.diagnose_node",
    APPLY_FIX: "fleet.apply_fix",
    ACKNOWLEDGE_XID: "fleet.acknowledge_xid",
    MANAGE_USERS: "auth.change_user",
    MANAGE_ALERTS: "alerts.change_rule",
    MAINTAIN: "fleet.change_maintenance",
    RUN_DCGM_DIAG: "fleet.run_dcgm_diag",
}


def can(user, action: str) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(_PERMISSION[action]))


def can_open_admin(user) -> bool:
    """Django's admin site: staff, as in Django, and the admin role (through its user
    management permission, so no extra query), which manages users there within the
    roles (gpufleet/core/admin.py) and reads the rest."""
    return bool(user and user.is_authenticated and user.is_active and (user.is_staff or can(user, MANAGE_USERS)))


def requires(action: str, *, tokens: bool = False):
    """View decorator: 403 unless the user may `action` (login is enforced by middleware).

    With `tokens` (the exports scripts download), an API token sent as
    `Authorization: Bearer` stands in for the session, as in the API: it acts as its
    user under the same rules, and an unknown or revoked one is a 401, never the login
    page. Without a token the login is asked for as everywhere else."""

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if tokens and (refused := _token_login(request)) is not None:
                return refused
            if not can(request.user, action):
                raise PermissionDenied(f"your role may not {action.replace('_', ' ')}")
            return view(request, *args, **kwargs)

        # The middleware would send a token's request to the login page before the view runs.
        return login_not_required(wrapper) if tokens else wrapper

    return decorator


# The user an API token acts as, or None. The API app owns tokens and sets this as it
# loads (core imports no app); until then every token is refused.
_token_user: Callable[[str], object] | None = None


def use_api_tokens(token_user: Callable[[str], object]) -> None:
    """How `requires(..., tokens=True)` finds a token's user: set once by the API app."""
    global _token_user
    _token_user = token_user


def _token_login(request: HttpRequest) -> HttpResponse | None:
    """Log the request in as its Bearer token's user (for this request only); None when
    it may go on, else the answer: 401 for a bad token, the login page for no login."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        user = _token_user(secret.strip()) if _token_user is not None else None
        if user is None:
            # Never fall back to a session: the caller meant this token.
            response = HttpResponse("The API token is unknown or revoked.\n", status=401,
                                    content_type="text/plain; charset=utf-8")
            response["WWW-Authenticate"] = "Bearer"
            return response
        request.user = user
        return None
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    return None


def access_context(request) -> dict:
    """Context processor: `access.edit_claims` etc. (and `access.open_admin`) for hiding
    controls in templates."""
    user = getattr(request, "user", None)
    return {"access": {action: can(user, action) for action in _PERMISSION} | {"open_admin": can_open_admin(user)}}
