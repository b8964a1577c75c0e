"""LDAP / Active Directory login: the login form's password checked by binding to the
directory as the person (django-auth-ldap), then the common single sign-on step
(`sign_in`) finds or makes the user and sets the role their groups give. The library
never makes or changes a user itself, so a local account of the same name is never
taken over. Settings: gpufleet/sso/ldap_settings.py."""

from __future__ import annotations

import logging
from contextvars import ContextVar

import ldap
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.dispatch import receiver
from django_auth_ldap.backend import LDAPBackend, ldap_error

from gpufleet.audit.models import Action, record
from gpufleet.sso.backends import ActiveOnly
from gpufleet.sso.models import Identity
from gpufleet.sso.recheck import Gone, Unavailable
from gpufleet.sso.services import is_local_account, sign_in

logger = logging.getLogger(__name__)

SOURCE = Identity.Source.LDAP
WRONG_PASSWORD = "the directory refused the password"
# Said on the login page when the directory could not be asked; the details go to the log and audit.
UNREACHABLE = ("The directory could not check your password: it could not be reached, or its certificate "
               "is not trusted. Try again later, or ask {contact}.")


class _Refused(Exception):
    """`sign_in` turned the person away (and audited why): the login fails."""


class _Moved(Exception):
    """Asking again, the login name now names another entry (the message: its DN)."""


# The directory errors met while `groups_of` asks (django-auth-ldap reports them by signal).
_asking_errors: ContextVar[list[Exception] | None] = ContextVar("_asking_errors", default=None)


class LDAPLoginBackend(ActiveOnly, LDAPBackend):
    """django-auth-ldap's backend with gpufleet's users: after the directory accepts the
    password, `sign_in` decides (get_or_build_user, the library's documented hook)."""

    asking: Identity | None = None

    def authenticate(self, request, username=None, password=None, **kwargs):
        # Django makes a backend for each authenticate(): the request is this login's.
        self.request, self.username = request, (username or "").strip().lower()
        return super().authenticate(request, username=username, password=password, **kwargs)

    def authenticate_ldap_user(self, ldap_user, password):
        try:
            user = super().authenticate_ldap_user(ldap_user, password)
        except _Refused:
            return None
        if user is None and not _failed(self.request) and _known(ldap_user) and not _local_account(self.username):
            # A directory user whose password it refused (an unknown name is only the throttle's,
            # a local account's mistyped password its own: the directory's namesake never logs in here).
            record(None, Action.SSO_REFUSED, target=_target(self.username), after={"source": SOURCE,
                                                                                 "reason": WRONG_PASSWORD})
        return user

    def get_or_build_user(self, username, ldap_user):
        """The user `sign_in` gives for this directory entry, never one the library makes:
        called only once the directory accepted the password (or, asking again, `groups_of`
        found the entry: then the user as they are, their groups noted)."""
        if self.asking is not None:
            if ldap_user.dn.lower() != self.asking.subject.lower():
                raise _Moved(ldap_user.dn)
            self.groups = list(ldap_user.group_dns)
            return self.asking.user, False
        attrs = ldap_user.attrs or {}
        profile = {field: _first(attrs, attribute) for field, attribute in settings.GPUFLEET_LDAP_ATTRS.items()}
        user = sign_in(getattr(self, "request", None), source=SOURCE, subject=ldap_user.dn,
                       username=username.lower(), groups=ldap_user.group_dns, **profile)
        if user is None:
            raise _Refused(f"single sign-on refused {username}")
        # Not built: the library saves and populates nothing (AUTH_LDAP_ALWAYS_UPDATE_USER is off).
        return user, False


def groups_of(identity: Identity) -> list[str]:
    """The groups the directory gives this person now, read with the service account
    (django-auth-ldap's populate_user) as a login reads them (recheck.ASK)."""
    if not settings.GPUFLEET_LDAP_URI:
        raise Unavailable("LDAP login is not set up (GPUFLEET_LDAP_URI)")
    backend = LDAPLoginBackend()
    backend.asking, backend.groups = identity, None
    errors: list[Exception] = []
    asking = _asking_errors.set(errors)
    try:
        backend.populate_user(identity.user.get_username())
    except _Moved as moved:
        raise Gone(f"the directory's entry for {identity.user.get_username()} is now {moved}, "
                   f"not {identity.subject}") from None
    finally:
        _asking_errors.reset(asking)
    if errors:
        raise Unavailable(describe(errors[0]))
    if backend.groups is None:
        raise Gone(f"the directory has no entry for {identity.user.get_username()} any more")
    return backend.groups


@receiver(ldap_error, sender=LDAPLoginBackend)
def directory_failed(sender, context, user, request, exception, **kwargs) -> None:
    """The directory could not be asked (down, TLS refused, a search failed): the person
    is told so on the login page instead of only "wrong password", and the admin finds
    the cause in the log and the audit log."""
    reason = f"the directory could not be reached or failed ({describe(exception)})"
    if isinstance(exception, (ldap.SERVER_DOWN, ldap.CONNECT_ERROR)):
        reason += "; if it uses TLS, is its CA in GPUFLEET_LDAP_CA_FILE?"
    logger.error("LDAP login: %s", reason)
    asking = _asking_errors.get()
    if asking is not None:
        asking.append(exception)
    # A login's own errors (finding the person, binding as them) once each login; others only logged.
    if context not in ("search_for_user_dn", "authenticate") or request is None or _failed(request):
        return
    request.gpufleet_ldap_failed = True
    username = request.POST.get("username", "") if request.method == "POST" else ""
    record(None, Action.SSO_REFUSED, target=_target(username), after={"source": SOURCE, "reason": reason})
    # fail_silently: a request without the messages middleware (a script's) still just fails.
    messages.error(request, UNREACHABLE.format(contact=settings.GPUFLEET_SSO_CONTACT), fail_silently=True)


def describe(exception: Exception) -> str:
    """python-ldap's error in words: its description and the server's or TLS library's detail."""
    detail = exception.args[0] if exception.args and isinstance(exception.args[0], dict) else {}
    words = [str(detail.get(key, "")).strip() for key in ("desc", "info")]
    return ": ".join(word for word in words if word and word != "(unknown error code)") or repr(exception)


def _failed(request) -> bool:
    return bool(getattr(request, "gpufleet_ldap_failed", False))


def _known(ldap_user) -> bool:
    """Whether the directory has an entry for the name tried (asked again only if not yet found)."""
    try:
        return ldap_user.dn is not None
    except ldap.LDAPError:
        return False


def _local_account(username: str) -> bool:
    model = get_user_model()
    user = model.objects.filter(**{f"{model.USERNAME_FIELD}__iexact": username}).first()
    return user is not None and is_local_account(user)


def _first(attrs, attribute: str) -> str:
    values = attrs.get(attribute) or [""]
    return str(values[0]).strip()


def _target(username: str) -> str:
    """The audit row's target: the login name, as `sign_in`'s rows name it."""
    return username.strip().lower()
