"""OpenID Connect login's settings: GPUFLEET_OIDC_* read from the environment
(docs/sso.md#openid-connect). gpufleet/settings.py takes them as they are; a bad value stops
the start with a message naming the variable. The provider itself is asked nothing here:
one that is down at start-up must not keep the site from starting."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.env import SettingError, env_bool, env_float

# mozilla-django-oidc verifies RS* and ES* signatures with the provider's published keys;
# anything else it would check with the client secret, which the client knows too.
SIGN_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


def read() -> dict[str, object]:
    """Every GPUFLEET_OIDC_* setting; the login is on when GPUFLEET_OIDC_ISSUER is set, and
    only then are the others checked."""
    issuer = os.environ.get("GPUFLEET_OIDC_ISSUER", "").strip()
    got = {
        "GPUFLEET_OIDC_ISSUER": issuer,
        "GPUFLEET_OIDC_CLIENT_ID": os.environ.get("GPUFLEET_OIDC_CLIENT_ID", "").strip(),
        "GPUFLEET_OIDC_CLIENT_SECRET": _secret(),
        "GPUFLEET_OIDC_SCOPES": " ".join(os.environ.get("GPUFLEET_OIDC_SCOPES", "").split())
        or "openid email profile",
        "GPUFLEET_OIDC_PROVIDER_NAME": os.environ.get("GPUFLEET_OIDC_PROVIDER_NAME", "").strip() or "single sign-on",
        "GPUFLEET_OIDC_USERNAME_CLAIM": os.environ.get("GPUFLEET_OIDC_USERNAME_CLAIM", "").strip()
        or "preferred_username",
        "GPUFLEET_OIDC_GROUPS_CLAIM": os.environ.get("GPUFLEET_OIDC_GROUPS_CLAIM", "").strip() or "groups",
        "GPUFLEET_OIDC_SIGN_ALGO": os.environ.get("GPUFLEET_OIDC_SIGN_ALGO", "").strip().upper() or "RS256",
        "GPUFLEET_OIDC_CA_FILE": os.environ.get("GPUFLEET_OIDC_CA_FILE", "").strip(),
        "GPUFLEET_OIDC_TIMEOUT": env_float("GPUFLEET_OIDC_TIMEOUT", 10.0, minimum=1.0),
    }
    if issuer:
        _check(got)
    return got


def allow_logout_at_provider(policy: dict, issuer: str) -> dict:
    """CONTENT_SECURITY_POLICY with the provider's origin among form-action's: the logout
    form's answer sends a person who came through the provider on to its end_session_endpoint,
    and browsers hold a form's redirects to form-action too."""
    parts = urlsplit(issuer)
    directives = {**policy["DIRECTIVES"]}
    directives["form-action"] = [*directives["form-action"], f"{parts.scheme}://{parts.netloc}"]
    return {**policy, "DIRECTIVES": directives}


def _secret() -> str:
    value = os.environ.get("GPUFLEET_OIDC_CLIENT_SECRET", "")
    path = os.environ.get("GPUFLEET_OIDC_CLIENT_SECRET_FILE", "").strip()
    if not path:
        return value.strip()
    if value.strip():
        raise SettingError("GPUFLEET_OIDC_CLIENT_SECRET and GPUFLEET_OIDC_CLIENT_SECRET_FILE are both set: keep one")
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingError(f"GPUFLEET_OIDC_CLIENT_SECRET_FILE: cannot read {path!r} ({error.__class__.__name__})") \
            from None


def _check(got: dict[str, object]) -> None:
    issuer = str(got["GPUFLEET_OIDC_ISSUER"])
    parts = urlsplit(issuer)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
        raise SettingError(f"GPUFLEET_OIDC_ISSUER: {issuer!r} is not an issuer URL "
                           "(for example https://sso.example.org/realms/gpu)")
    if parts.scheme == "http" and parts.hostname not in _LOOPBACK_HOSTS and env_bool("GPUFLEET_PRODUCTION", False):
        raise SettingError(f"GPUFLEET_OIDC_ISSUER {issuer} would carry the client secret and tokens in clear: "
                           "use the provider's https:// address")
    for name in ("GPUFLEET_OIDC_CLIENT_ID", "GPUFLEET_OIDC_CLIENT_SECRET"):
        if not got[name]:
            also = " (or GPUFLEET_OIDC_CLIENT_SECRET_FILE)" if name.endswith("SECRET") else ""
            raise SettingError(f"GPUFLEET_OIDC_ISSUER is set, so {name}{also} must be too: the provider's client "
                               "for this site")
    if "openid" not in str(got["GPUFLEET_OIDC_SCOPES"]).split():
        raise SettingError(f"GPUFLEET_OIDC_SCOPES={got['GPUFLEET_OIDC_SCOPES']!r} must include openid")
    if got["GPUFLEET_OIDC_SIGN_ALGO"] not in SIGN_ALGORITHMS:
        raise SettingError(f"GPUFLEET_OIDC_SIGN_ALGO={got['GPUFLEET_OIDC_SIGN_ALGO']!r} is not one of "
                           f"{', '.join(SIGN_ALGORITHMS)}")
    ca_file = str(got["GPUFLEET_OIDC_CA_FILE"])
    if ca_file and not Path(ca_file).is_file():
        raise SettingError(f"GPUFLEET_OIDC_CA_FILE: {ca_file!r} is not a file")
