"""One login through single sign-on, whichever way it came (LDAP, OIDC, an authenticating
proxy): find or make the user, give them the role and the teams their groups map to, and
audit it. The directory decides at every login, and again while they stay signed in
(`follow`, asked by gpufleet/sso/recheck.py), so a person removed from a group loses the
role or the team without logging in."""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpufleet.audit.models import Action, record
from gpufleet.core.roles import ROLE_PERMISSIONS
from gpufleet.sso.groups import matched_groups, role_for, teams_for
from gpufleet.sso.models import Identity
from gpufleet.teams.models import Membership, Team

# Where the no-access page finds why the last login was refused.
REFUSAL_KEY = "sso_refusal"


class Refused(Exception):
    """A login single sign-on turns away; the message is shown to the person and audited."""


def sign_in(request, *, source: str, subject: str, username: str, email: str = "", first_name: str = "",
            last_name: str = "", groups: Iterable[str]):
    """The active user for this directory identity, with exactly the role its groups map
    to; None when refused (no mapped group, a local account of that name, a user an admin
    deactivated, a name Django cannot hold), the reason kept for the no-access page."""
    groups = clean_groups(groups)
    role = role_for(groups, settings.GPUFLEET_SSO_ROLE_GROUPS, settings.GPUFLEET_SSO_DEFAULT_ROLE or None)
    details = {"source": source, "groups": matched_groups(groups, settings.GPUFLEET_SSO_ROLE_GROUPS)}
    with transaction.atomic():
        try:
            user = _sign_in(source, subject, username, role, groups, details,
                            email=email, first_name=first_name, last_name=last_name)
        except Refused as refusal:
            # Caught inside the transaction: a deactivation made before refusing is kept.
            reason = str(refusal)
            record(None, Action.SSO_REFUSED, target=username, after={**details, "reason": reason})
        else:
            if request is not None and hasattr(request, "session"):
                request.session.pop(REFUSAL_KEY, None)
            return user
    if request is not None and hasattr(request, "session"):
        request.session[REFUSAL_KEY] = {"username": username, "reason": reason}
    return None


def _sign_in(source, subject, username, role, groups, details, **profile):
    identity = Identity.objects.select_for_update().select_related("user").filter(source=source, subject=subject).first()
    if identity is None:
        identity = Identity(source=source, subject=subject, user=_user_for(username))
    user = identity.user
    if user.is_superuser:
        # Superusers are the local break-glass accounts: the directory never acts as one.
        raise Refused(f"{user.get_username()} is a superuser of this site, who logs in with a local password only")
    if user.pk is not None and not user.is_active and not identity.refused:
        raise Refused(f"the account {user.get_username()} was deactivated by an admin of this site")
    identity.groups, identity.seen_at = groups, timezone.now()
    if role is None:
        if user.pk is not None:
            _revoke(identity, details)
            _set_teams(user, groups, source)
        raise Refused(no_group(username))

    _update_profile(user, **profile)
    user.is_active = True
    user.save()
    identity.user, identity.role, identity.refused = user, role, False
    identity.save()
    _set_role(user, role, details)
    _set_teams(user, groups, source)
    record(user, Action.SSO_LOGIN, target=user.get_username(), after={**details, "role": role})
    return user


def follow(identity: Identity, groups: Iterable[str] | None, gone: str = "") -> bool:
    """What the directory says now about a person who signed in before: the role and the
    teams their groups give (audited when they change) or, in no mapped group or no longer known to it (`gone`
    says how), no access at once: role, sessions and tokens, audited. True while they keep access."""
    with transaction.atomic():
        identity = Identity.objects.select_for_update().select_related("user").get(pk=identity.pk)
        user = identity.user
        if not user.is_active or identity.refused:
            return user.is_active
        if groups is not None:
            identity.groups = clean_groups(groups)
        identity.seen_at = timezone.now()
        role = None if gone else role_for(identity.groups, settings.GPUFLEET_SSO_ROLE_GROUPS,
                                          settings.GPUFLEET_SSO_DEFAULT_ROLE or None)
        details = {"source": identity.source,
                   "groups": matched_groups(identity.groups, settings.GPUFLEET_SSO_ROLE_GROUPS)}
        _set_teams(user, [] if gone else identity.groups, identity.source)
        if role is None:
            _revoke(identity, details)
            record(None, Action.SSO_REFUSED, target=user.get_username(),
                   after={**details, "reason": gone or no_group(user.get_username()), "asked_again": True})
            return False
        identity.role = role
        identity.save()
        _set_role(user, role, details)
        return True


def clean_groups(groups: Iterable[str]) -> list[str]:
    """A directory's group names as an identity keeps them: sorted, once each, none blank."""
    return sorted({group.strip() for group in groups if isinstance(group, str) and group.strip()})


def no_group(username: str) -> str:
    return f"{username} is in none of the directory groups that give a role on this site"


def _revoke(identity: Identity, details: dict) -> None:
    """Out of every mapped group: no access, and the tokens and sessions stop too (an
    inactive user's are refused); the next login with a mapped group gives them back."""
    user = identity.user
    identity.role, identity.refused = "", True
    user.is_active = False
    user.save(update_fields=["is_active"])
    identity.save()
    _set_role(user, None, details)


def is_local_account(user) -> bool:
    """A user of the site's own (a superuser, or one single sign-on never made): no directory logs it in."""
    return user.is_superuser or not user.identities.exists()


def _user_for(username: str):
    """The user single sign-on may log in under this name: an existing user who came from
    single sign-on too, or a new one (not saved yet). A local account is never taken over."""
    model = get_user_model()
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise Refused(f"the directory gave the user name {username!r}, which is not one this site can hold") from None
    field = model._meta.get_field(model.USERNAME_FIELD)
    if not username or len(username) > field.max_length:
        raise Refused(f"the directory gave a user name of {len(username)} characters; this site holds 1 to {field.max_length}")
    user = model.objects.filter(**{f"{model.USERNAME_FIELD}__iexact": username}).first()
    if user is None:
        user = model(**{model.USERNAME_FIELD: username})
        user.set_unusable_password()
        return user
    if is_local_account(user):
        raise Refused(f"{user.get_username()} is a local account of this site; single sign-on does not take it over")
    return user


def _update_profile(user, **profile) -> None:
    for name, value in profile.items():
        if value:
            setattr(user, name, value[: user._meta.get_field(name).max_length])


def _set_role(user, role: str | None, details: dict) -> None:
    """Exactly `role`'s group of the three role groups; other groups an admin gave stay."""
    held = set(user.groups.filter(name__in=ROLE_PERMISSIONS).values_list("name", flat=True))
    wanted = {role} if role else set()
    if held == wanted:
        return
    user.groups.remove(*Group.objects.filter(name__in=held - wanted))
    user.groups.add(*Group.objects.filter(name__in=wanted))
    record(user, Action.SSO_ROLE, target=user.get_username(),
           before={"role": ", ".join(sorted(held)) or None}, after={**details, "role": role})


def _set_teams(user, groups: list[str], source: str) -> None:
    """Exactly the teams `groups` give as the person's directory memberships (a team made when
    no team has its name); memberships an admin added by hand stay as the admin set them."""
    mapping = settings.GPUFLEET_SSO_TEAM_GROUPS
    wanted = {name.lower(): (name, lead) for name, lead in teams_for(groups, mapping).items()}
    held = {row.team.name.lower(): row for row in user.memberships.select_related("team")}
    before = _directory_teams(held.values())
    Membership.objects.filter(pk__in=[row.pk for key, row in held.items()
                                      if row.from_directory and key not in wanted]).delete()
    for key, (name, lead) in wanted.items():
        row = held.get(key)
        if row is None:
            Membership.objects.create(team=_team(name, source), user=user, lead=lead, from_directory=True)
        elif row.from_directory and row.lead != lead:
            row.lead = lead
            row.save(update_fields=["lead"])
    after = _directory_teams(user.memberships.select_related("team"))
    if after != before:
        record(user, Action.SSO_TEAMS, target=user.get_username(), before=before,
               after={"source": source, "groups": matched_groups(groups, mapping), **after})


def _directory_teams(memberships: Iterable[Membership]) -> dict:
    rows = sorted((row for row in memberships if row.from_directory), key=lambda row: row.team.name.lower())
    return {"teams": [row.team.name for row in rows], "leads": [row.team.name for row in rows if row.lead]}


def _team(name: str, source: str) -> Team:
    """The team of this name whatever its case, made (and audited) when there is none."""
    team = Team.objects.filter(name__iexact=name).first()
    if team is not None:
        return team
    try:
        with transaction.atomic():
            team = Team.objects.create(name=name)
    except IntegrityError:
        # Made meanwhile by another person's first login: theirs is the one.
        return Team.objects.get(name__iexact=name)
    record(None, Action.TEAM_CREATE, target=name, after={"name": name, "source": source})
    return team
