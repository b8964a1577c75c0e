"""Single sign-on's common part, through its simplest way in: an authenticating proxy's
headers on requests from a trusted proxy (the LDAP and OIDC tests run the same `sign_in`
against a real slapd and a real OpenID provider)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings
from django.urls import reverse

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import Action, AuditEntry
from gpufleet.core.access import APPLY_FIX, EDIT_CLAIMS, can
from gpufleet.sso.groups import parse_role_groups
from gpufleet.sso.models import Identity

PROXY = "10.0.0.5"
SETTINGS = {
    "GPUFLEET_TRUSTED_PROXIES": [PROXY],
    "GPUFLEET_REMOTE_USER_HEADER": "X-Forwarded-User",
    "GPUFLEET_REMOTE_GROUPS_HEADER": "X-Forwarded-Groups",
    "GPUFLEET_REMOTE_EMAIL_HEADER": "X-Forwarded-Email",
    "GPUFLEET_SSO_ROLE_GROUPS": parse_role_groups("admin=gpu-admins; operator=gpu-operators; viewer=gpu-users"),
    "GPUFLEET_SSO_DEFAULT_ROLE": "",
    "GPUFLEET_SSO_CONTACT": "the GPU team (#gpu-help)",
    "AUTHENTICATION_BACKENDS": ["axes.backends.AxesStandaloneBackend", "gpufleet.sso.backends.LocalBackend",
                                "gpufleet.sso.proxy.ProxyBackend"],
}

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("proxy_settings")]


@pytest.fixture
def proxy_settings():
    with override_settings(**SETTINGS):
        yield


def through_proxy(client: Client, path: str, user: str, groups: str = "", peer: str = PROXY, **extra):
    return client.get(path, REMOTE_ADDR=peer, HTTP_X_FORWARDED_USER=user, HTTP_X_FORWARDED_GROUPS=groups,
                      HTTP_X_FORWARDED_EMAIL=f"{user}@example.org", **extra)


def password_login(username: str, password: str) -> bool:
    client = Client()
    client.post(reverse("login"), {"username": username, "password": password})
    return "_auth_user_id" in client.session


def roles(user) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


def actions(target: str) -> list[str]:
    return list(AuditEntry.objects.filter(target=target).order_by("at", "id").values_list("action", flat=True))


def test_an_operator_group_member_is_made_an_operator_and_audited(alpha):
    response = through_proxy(Client(), "/", "alice", "staff, gpu-operators")
    assert response.status_code == 200
    alice = User.objects.get(username="alice")
    assert roles(alice) == ["operator"] and alice.email == "alice@example.org"
    assert not alice.has_usable_password() and not alice.is_staff and not alice.is_superuser
    assert can(alice, EDIT_CLAIMS) and not can(alice, APPLY_FIX)
    assert Identity.objects.get(user=alice).subject == "alice"
    assert actions("alice") == [Action.SSO_ROLE, Action.SSO_LOGIN]
    login = AuditEntry.objects.get(action=Action.SSO_LOGIN)
    assert login.after == {"source": "proxy", "groups": ["gpu-operators"], "role": "operator"}


def test_the_headers_are_ignored_from_anyone_but_a_trusted_proxy(alpha):
    response = through_proxy(Client(), "/", "alice", "gpu-admins", peer="10.0.0.99")
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert not User.objects.filter(username="alice").exists()
    assert not AuditEntry.objects.exists()


def test_the_admin_group_never_makes_a_superuser(alpha):
    through_proxy(Client(), "/", "root", "gpu-admins")
    root = User.objects.get(username="root")
    assert roles(root) == ["admin"] and not root.is_superuser and not root.is_staff


def test_no_mapped_group_means_no_access_and_says_whom_to_ask(alpha):
    client = Client()
    response = through_proxy(client, "/", "mallory", "staff", follow=True)
    assert response.redirect_chain[-1][0] == reverse("sso:no-access")
    page = response.content.decode()
    assert "mallory" in page and "none of the directory groups" in page and "the GPU team (#gpu-help)" in page
    assert not User.objects.filter(username="mallory").exists()
    refused = AuditEntry.objects.get(action=Action.SSO_REFUSED)
    assert refused.target == "mallory" and "none of the directory groups" in refused.after["reason"]

    # Not asked (nor audited) again on each request of that session, until "Try again".
    through_proxy(client, "/", "mallory", "staff")
    assert AuditEntry.objects.filter(action=Action.SSO_REFUSED).count() == 1
    client.post(reverse("sso:try-again"), REMOTE_ADDR=PROXY)
    assert through_proxy(client, "/", "mallory", "gpu-users").status_code == 200


def test_the_default_role_lets_everyone_the_directory_knows_read(alpha):
    with override_settings(GPUFLEET_SSO_DEFAULT_ROLE="viewer"):
        assert through_proxy(Client(), "/", "dave", "staff").status_code == 200
    assert roles(User.objects.get(username="dave")) == ["viewer"]


def test_removed_from_the_group_the_next_login_has_no_access_and_the_tokens_stop(alpha):
    first = Client()
    through_proxy(first, "/", "alice", "gpu-operators")
    alice = User.objects.get(username="alice")
    _, secret = ApiToken.issue(alice, "ci", ApiToken.Scope.READ_WRITE)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    assert Client().get("/api/nodes/", **bearer).status_code == 200

    # The proxy's next login for her (a new session) carries her groups without the mapped one.
    later = Client()
    response = through_proxy(later, "/", "alice", "staff", follow=True)
    assert response.redirect_chain[-1][0] == reverse("sso:no-access")
    alice.refresh_from_db()
    assert not alice.is_active and roles(alice) == []
    assert Client().get("/api/nodes/", **bearer).status_code == 401
    # Her earlier session ends too, even without the proxy (a direct request with its cookie).
    assert first.get("/", REMOTE_ADDR="10.0.0.99").status_code == 302
    assert actions("alice")[-2:] == [Action.SSO_ROLE, Action.SSO_REFUSED]
    role_change = AuditEntry.objects.filter(action=Action.SSO_ROLE).order_by("-id").first()
    assert role_change.before == {"role": "operator"} and role_change.after["role"] is None

    # Back in the group: her next login gives the role back, and the token works again.
    assert through_proxy(Client(), "/", "alice", "gpu-operators").status_code == 200
    alice.refresh_from_db()
    assert alice.is_active and roles(alice) == ["operator"]
    assert Client().get("/api/nodes/", **bearer).status_code == 200


def test_a_changed_group_changes_the_role_at_the_next_login_and_keeps_other_groups(alpha):
    through_proxy(Client(), "/", "alice", "gpu-users")
    alice = User.objects.get(username="alice")
    alice.groups.add(Group.objects.create(name="night-shift"))
    through_proxy(Client(), "/", "alice", "gpu-admins")
    assert roles(alice) == ["admin", "night-shift"]
    role_change = AuditEntry.objects.filter(action=Action.SSO_ROLE).order_by("-id").first()
    assert role_change.before == {"role": "viewer"} and role_change.after["role"] == "admin"


def test_a_user_an_admin_deactivated_stays_out(alpha):
    through_proxy(Client(), "/", "alice", "gpu-operators")
    User.objects.filter(username="alice").update(is_active=False)
    response = through_proxy(Client(), "/", "alice", "gpu-operators", follow=True)
    assert "deactivated by an admin" in response.content.decode()
    assert not User.objects.get(username="alice").is_active


@pytest.mark.parametrize("local", ["ops", "Ops"])
def test_a_local_account_is_never_taken_over(alpha, django_user_model, local):
    django_user_model.objects.create_superuser(username="ops", password="pw-ops-local")
    response = through_proxy(Client(), "/", local, "gpu-admins", follow=True)
    assert "is a local account of this site" in response.content.decode()
    assert not Identity.objects.exists()
    assert AuditEntry.objects.get(action=Action.SSO_REFUSED).target == local


def test_a_name_this_site_cannot_hold_is_refused_clearly(alpha):
    response = through_proxy(Client(), "/", "a b<script>", "gpu-admins", follow=True)
    page = response.content.decode()
    assert "not one this site can hold" in page and "<script>" not in page
    assert not User.objects.filter(username__startswith="a b").exists()


def test_local_passwords_off_leave_only_the_break_glass_superuser(alpha, django_user_model, operator):
    django_user_model.objects.create_superuser(username="root", password="pw-root-local")
    sso_admin = django_user_model.objects.create_superuser(username="sso-admin", password="pw-sso-admin")
    Identity.objects.create(user=sso_admin, source=Identity.Source.PROXY, subject="sso-admin")
    signed_in = Client()
    signed_in.force_login(operator, backend="gpufleet.sso.backends.LocalBackend")
    with override_settings(GPUFLEET_LOCAL_LOGIN=False):
        page = Client().get(reverse("login")).content.decode()
        assert "Break-glass login" in page
        assert not password_login("otto", "pw-otto")
        assert not password_login("sso-admin", "pw-sso-admin")
        assert password_login("root", "pw-root-local")
        # A local user's session from before ends too.
        assert signed_in.get("/").status_code == 302
    assert password_login("otto", "pw-otto")
    assert "Break-glass" not in Client().get(reverse("login")).content.decode()


def test_the_no_access_page_needs_no_login_and_try_again_only_posts():
    assert Client().get(reverse("sso:no-access")).status_code == 200
    assert Client().get(reverse("sso:try-again")).status_code == 405


def test_a_superuser_never_logs_in_through_single_sign_on(alpha):
    """Superusers are local break-glass accounts: one an admin made of a directory user
    is refused by the directory's login, so the directory can never act as a superuser."""
    through_proxy(Client(), "/", "alice", "gpu-admins")
    User.objects.filter(username="alice").update(is_superuser=True)
    response = through_proxy(Client(), "/", "alice", "gpu-admins", follow=True)
    assert "is a superuser of this site, who logs in with a local password only" in response.content.decode()
    assert "_auth_user_id" not in response.client.session


def test_a_refused_long_name_is_audited_once_a_visit(alpha):
    """The session remembers the whole name refused, so the proxy's next requests of that
    visit are not asked (and audited) again, however long the name."""
    client = Client()
    response = through_proxy(client, "/", "a" * 300, "gpu-admins", follow=True)
    assert response.redirect_chain[-1][0] == reverse("sso:no-access")
    through_proxy(client, "/claims/", "a" * 300, "gpu-admins")
    refused = AuditEntry.objects.filter(action=Action.SSO_REFUSED)
    assert refused.count() == 1 and refused.get().target == "a" * 200


def test_people_refused_through_the_proxy_lock_nobody_out(alpha, settings):
    """A person the groups refuse did not guess a password: however many are refused (or
    one presses "Try again" over and over), the proxy's address is not locked out."""
    for n in range(settings.AXES_FAILURE_LIMIT + 1):
        response = through_proxy(Client(), "/", f"stranger{n}", "staff", follow=True)
        assert response.redirect_chain[-1][0] == reverse("sso:no-access")
    mallory = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        through_proxy(mallory, "/", "mallory", "staff")
        mallory.post(reverse("sso:try-again"), REMOTE_ADDR=PROXY)

    response = through_proxy(Client(), "/", "root", "gpu-admins")
    assert response.status_code == 200 and roles(User.objects.get(username="root")) == ["admin"]
    assert not AuditEntry.objects.filter(action=Action.LOGIN_LOCKOUT).exists()


def test_wrong_passwords_behind_the_proxy_lock_out_that_person_only(operator, viewer, settings):
    def local_login(username: str, password: str, client_address: str) -> int:
        return Client().post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=PROXY,
                             HTTP_X_FORWARDED_FOR=client_address).status_code

    codes = [local_login("otto", "wrong", "192.0.2.7") for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert codes[-1] == 429 and local_login("otto", "pw-otto", "192.0.2.7") == 429
    # Others at the proxy, and the same person at another client address, still log in.
    assert local_login("vera", "pw-vera", "192.0.2.7") == 302
    assert local_login("otto", "pw-otto", "192.0.2.8") == 302
    assert through_proxy(Client(), "/", "root", "gpu-admins").status_code == 200
