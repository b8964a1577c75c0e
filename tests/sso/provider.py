"""A real OpenID provider for the OpenID Connect login's tests: django-oauth-toolkit's, in the
small Django project tests/oidc_provider/, run as a second process (`python -m django
runserver`) on a loopback port of its own with its own SQLite file and an RSA key made for the
test session. The site is registered there as a confidential client with PKCE; its users and
their groups are set with the project's `provider` command, as a directory's admin would.

Use the `openid_provider` fixture (a test module assigns it: `openid_provider =
provider.openid_provider`, as tests/browser/conftest.py does with the broker). The provider's
groups and misbehaviours are put back after each test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests

from tests.receivers import free_port
from tests.sso import servers

REPO = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "gpufleet", "gpufleet-client-secret"
# The site's callback as the Django test client (testserver) and the browser's live server see it.
TEST_CLIENT_CALLBACK = "http://testserver/oidc/callback/"

# username: (given name, family name, password, groups)
PEOPLE = {
    "olivia": ("Olivia", "Oakes", "olivia-secret", ["gpu-operators"]),
    "vince": ("Vince", "Vale", "vince-secret", ["gpu-users"]),
    "adele": ("Adele", "Ames", "adele-secret", ["gpu-admins", "gpu-users"]),
    "ned": ("Ned", "Noone", "ned-secret", []),
}
# The mapping the tests use, with a Keycloak group path among them.
ROLE_GROUPS = "admin=gpu-admins; operator=gpu-operators; viewer=/gpu-users"



def _rsa_key_pem() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class OpenIDProvider:
    """The running provider, and what a test needs to drive it."""

    folder: Path
    port: int
    proc: subprocess.Popen
    redirect_uris: list[str] = field(default_factory=lambda: [TEST_CLIENT_CALLBACK])
    changed: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    @property
    def private_key_pem(self) -> bytes:
        return (self.folder / "key.pem").read_bytes()

    def environment(self) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
            "PYTHONPATH": str(REPO),
            "OIDC_PROVIDER_DB": str(self.folder / "provider.sqlite3"),
            "OIDC_PROVIDER_KEY": str(self.folder / "key.pem"),
            "OIDC_PROVIDER_ISSUER": self.issuer,
            "OIDC_PROVIDER_MISBEHAVE": str(self.folder / "misbehave.json"),
        }

    def settings(self, **more) -> dict:
        """The site's settings for this provider (for override_settings)."""
        return {
            "GPUFLEET_OIDC_ISSUER": self.issuer,
            "GPUFLEET_OIDC_CLIENT_ID": CLIENT_ID,
            "GPUFLEET_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "GPUFLEET_SSO_ROLE_GROUPS": _role_groups(),
            **more,
        }

    def manage(self, *args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "django", *args], env={**os.environ, **self.environment()},
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"provider {' '.join(args)} failed ({done.returncode}): {done.stderr}"

    def set_groups(self, username: str, groups: list[str]) -> None:
        given, family, password, _ = PEOPLE[username]
        self.changed.add(username)
        self.manage("provider", "user", username, password, "--email", f"{username}@example.org",
                    "--first-name", given, "--last-name", family, *[f"--group={g}" for g in groups])

    def allow_redirect(self, site_url: str) -> None:
        """Register a live server's callback (and its login page, for logout) too."""
        uri = urljoin(site_url, "/oidc/callback/")
        if uri not in self.redirect_uris:
            self.redirect_uris.append(uri)
            self.register_client()

    def register_client(self) -> None:
        logouts = [urljoin(uri, "/accounts/login/") for uri in self.redirect_uris]
        self.manage("provider", "client", CLIENT_ID, CLIENT_SECRET, *self.redirect_uris,
                    *[f"--logout-uri={uri}" for uri in logouts])

    @contextmanager
    def misbehaving(self, **wrong):
        """ID tokens issued meanwhile carry these claims (iss, aud, azp, nonce, sub) or are `expired`
        this many seconds ago, still signed with the provider's key."""
        path = Path(self.environment()["OIDC_PROVIDER_MISBEHAVE"])
        path.write_text(json.dumps(wrong))
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def log_in(self, authorize_url: str, username: str, password: str | None = None,
               person: requests.Session | None = None) -> str:
        """A person at the provider (`person`: their browser there): opens the authorization
        URL the site sent them to, signs in on the provider's form and returns where the
        provider sends them back (the site's callback with code and state), unfollowed."""
        person = person or requests.Session()
        answer = person.get(authorize_url, allow_redirects=True, timeout=10)
        assert "/accounts/login/" in answer.url, answer.url
        token = person.cookies["provider_csrftoken"]
        next_url = parse_qs(urlsplit(answer.url).query)["next"][0]
        answer = person.post(answer.url, data={
            "csrfmiddlewaretoken": token, "username": username, "next": next_url,
            "password": password or PEOPLE[username][2],
        }, headers={"Referer": answer.url}, allow_redirects=False, timeout=10)
        assert answer.status_code == 302, answer.text
        answer = person.get(urljoin(self.url, answer.headers["Location"]), allow_redirects=False, timeout=10)
        assert answer.status_code == 302, answer.text
        return answer.headers["Location"]

    def stop(self) -> None:
        servers.stop(self.proc)


def _role_groups():
    from gpufleet.sso.groups import parse_role_groups

    return parse_role_groups(ROLE_GROUPS)


def start_provider() -> OpenIDProvider:
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-oidc-"))
    (folder / "key.pem").write_bytes(_rsa_key_pem())
    port = free_port()
    provider = OpenIDProvider(folder, port, proc=None)  # type: ignore[arg-type]
    provider.manage("migrate", "--verbosity", "0")
    provider.register_client()
    for username, (_, _, _, groups) in PEOPLE.items():
        provider.set_groups(username, groups)
    provider.changed.clear()
    log = (folder / "provider.log").open("w")
    provider.proc = subprocess.Popen([sys.executable, "-m", "django", "runserver", "--noreload",
                                      f"127.0.0.1:{port}"],
                                     env={**os.environ, **provider.environment()}, cwd=REPO,
                                     stdout=log, stderr=subprocess.STDOUT)
    discovery = f"{provider.issuer}/.well-known/openid-configuration"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if provider.proc.poll() is not None:
            raise AssertionError(f"the provider exited ({provider.proc.returncode}): "
                                 f"{(folder / 'provider.log').read_text()}")
        try:
            if requests.get(discovery, timeout=1).status_code == 200:
                return provider
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    provider.stop()
    raise AssertionError(f"the provider did not answer on {discovery}: {(folder / 'provider.log').read_text()}")


_provider = servers.once(start_provider)


@pytest.fixture
def openid_provider():
    """The test session's provider (started at the first test that asks for it, stopped as
    the session ends); its people's groups back as PEOPLE says after the test."""
    provider = _provider()
    yield provider
    for username in sorted(provider.changed):
        provider.set_groups(username, PEOPLE[username][3])
    provider.changed.clear()
