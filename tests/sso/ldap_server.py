"""A real OpenLDAP server (Debian's slapd) for the LDAP login's tests: a throwaway mdb
database in a scratch folder, loaded with slapadd, served on loopback ports over plain
LDAP (StartTLS offered) and ldaps, with a certificate from a throwaway CA made here with
`cryptography`. Membership changes go through `ldapmodify`, as a directory's admin makes
them. Missing slapd skips the tests on a developer's machine and fails them in CI.

Use the `directory` fixture (a test module assigns it: `directory = ldap_server.directory`,
as tests/browser/conftest.py does with the broker); it puts the groups back after each test."""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import missing_service
from tests.receivers import free_port
from tests.sso import servers

BASE = "dc=example,dc=org"
PEOPLE = f"ou=people,{BASE}"
GROUPS = f"ou=groups,{BASE}"
ROOT_DN, ROOT_PASSWORD = f"cn=admin,{BASE}", "root-secret"
# The account gpufleet searches with: read-only, as a site's service account would be.
SERVICE_DN, SERVICE_PASSWORD = f"cn=gpufleet,ou=services,{BASE}", "service-secret"

# uid: (given name, surname, password)
PEOPLE_ENTRIES = {
    "alice": ("Alice", "Adams", "alice-secret"),
    "bob": ("Bob", "Brown", "bob-secret"),
    "carol": ("Carol", "Clark", "carol-secret"),
    "dave": ("Dave", "Davis", "dave-secret"),
    "mallory": ("Mallory", "Moore", "mallory-secret"),
    "nina": ("Nina", "Nash", "nina-secret"),
}
# cn: members (uids, or "group:<cn>" for a nested group). carol is in no group; nina is
# an admin only through the nested group gpu-leads.
GROUP_ENTRIES = {
    "gpu-admins": ("dave", "group:gpu-leads"),
    "gpu-leads": ("nina",),
    "gpu-operators": ("alice", "mallory"),
    "gpu-viewers": ("bob",),
}
# The mapping the tests use: by DN and by CN, as GPUFLEET_SSO_ROLE_GROUPS allows.
ROLE_GROUPS = f"admin=cn=gpu-admins,{GROUPS}; operator=gpu-operators; viewer=gpu-viewers"
CONTACT = "the GPU team (#gpu-help)"
LDAP_BACKEND = "gpufleet.sso.ldap.LDAPLoginBackend"

SLAPD_CONF = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {folder}/slapd.pid
TLSCACertificateFile {folder}/ca.pem
TLSCertificateFile {folder}/server.pem
TLSCertificateKeyFile {folder}/server.key

database mdb
maxsize 16777216
suffix "{base}"
rootdn "{root_dn}"
rootpw {root_password}
directory {folder}/db
access to attrs=userPassword
    by anonymous auth
    by * none
access to *
    by dn.exact="{service_dn}" read
    by self read
    by * none
"""


def user_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


def group_dn(cn: str) -> str:
    return f"cn={cn},{GROUPS}"


def _member_dn(member: str) -> str:
    kind, _, name = member.rpartition(":")
    return group_dn(name) if kind == "group" else user_dn(name)


def _entries() -> str:
    blocks = [
        f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example",
        f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people",
        f"dn: {GROUPS}\nobjectClass: organizationalUnit\nou: groups",
        f"dn: ou=services,{BASE}\nobjectClass: organizationalUnit\nou: services",
        f"dn: {SERVICE_DN}\nobjectClass: person\ncn: gpufleet\nsn: gpufleet\nuserPassword: {SERVICE_PASSWORD}",
    ]
    for uid, (given, surname, password) in PEOPLE_ENTRIES.items():
        blocks.append(
            f"dn: {user_dn(uid)}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {given} {surname}\n"
            f"givenName: {given}\nsn: {surname}\nmail: {uid}@example.org\nuserPassword: {password}"
        )
    for cn, members in GROUP_ENTRIES.items():
        lines = "".join(f"\nmember: {_member_dn(m)}" for m in members)
        blocks.append(f"dn: {group_dn(cn)}\nobjectClass: groupOfNames\ncn: {cn}{lines}")
    return "\n\n".join(blocks) + "\n"



def _write_certificates(folder: Path) -> None:
    """A CA of its own and a server certificate for 127.0.0.1 and localhost signed by it:
    only a client given ca.pem trusts the server."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                          x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(server.public_bytes(pem))
    (folder / "server.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))


@dataclass
class Slapd:
    """A running slapd of the test session's own."""

    folder: Path
    port: int
    tls_port: int
    proc: subprocess.Popen

    @property
    def uri(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    @property
    def ldaps_uri(self) -> str:
        return f"ldaps://127.0.0.1:{self.tls_port}"

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    def environment(self, **more: str) -> dict[str, str]:
        """The GPUFLEET_LDAP_* variables a site with this directory sets."""
        return {
            "GPUFLEET_LDAP_URI": self.uri,
            "GPUFLEET_LDAP_BIND_DN": SERVICE_DN,
            "GPUFLEET_LDAP_BIND_PASSWORD": SERVICE_PASSWORD,
            "GPUFLEET_LDAP_USER_SEARCH_BASE": PEOPLE,
            "GPUFLEET_LDAP_GROUP_SEARCH_BASE": GROUPS,
            "GPUFLEET_LDAP_GROUP_TYPE": "nestedGroupOfNames",
            **more,
        }

    def modify(self, ldif: str) -> None:
        """ldapmodify as the directory's admin."""
        done = subprocess.run(["ldapmodify", "-x", "-H", self.uri, "-D", ROOT_DN, "-w", ROOT_PASSWORD],
                              input=ldif, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"ldapmodify failed ({done.returncode}): {done.stderr}"

    def remove_member(self, group: str, uid: str) -> None:
        self.modify(f"dn: {group_dn(group)}\nchangetype: modify\ndelete: member\nmember: {user_dn(uid)}\n")

    def add_member(self, group: str, uid: str) -> None:
        self.modify(f"dn: {group_dn(group)}\nchangetype: modify\nadd: member\nmember: {user_dn(uid)}\n")

    def reset_groups(self) -> None:
        """Every group's members as GROUP_ENTRIES says."""
        self.modify("\n".join(
            f"dn: {group_dn(cn)}\nchangetype: modify\nreplace: member\n"
            + "".join(f"member: {_member_dn(m)}\n" for m in members)
            for cn, members in GROUP_ENTRIES.items()
        ))

    def stop(self) -> None:
        servers.stop(self.proc)


def start_slapd() -> Slapd:
    binary = shutil.which("slapd") or ("/usr/sbin/slapd" if Path("/usr/sbin/slapd").exists() else None)
    slapadd = shutil.which("slapadd") or ("/usr/sbin/slapadd" if Path("/usr/sbin/slapadd").exists() else None)
    if binary is None or slapadd is None:
        missing_service("slapd is not installed (apt-get install slapd)")
    if shutil.which("ldapmodify") is None:
        missing_service("ldapmodify is not installed (apt-get install ldap-utils)")
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-slapd-"))
    (folder / "db").mkdir()
    _write_certificates(folder)
    conf = folder / "slapd.conf"
    conf.write_text(SLAPD_CONF.format(folder=folder, base=BASE, root_dn=ROOT_DN, root_password=ROOT_PASSWORD,
                                      service_dn=SERVICE_DN))
    loaded = subprocess.run([slapadd, "-q", "-f", str(conf)], input=_entries(), capture_output=True, text=True,
                            timeout=60)
    assert loaded.returncode == 0, f"slapadd failed ({loaded.returncode}): {loaded.stderr}"
    port, tls_port = free_port(), free_port()
    log = (folder / "slapd.log").open("w")
    # -d 0: stay in the foreground (the test owns the process), logging nothing but errors.
    proc = subprocess.Popen([binary, "-d", "0", "-f", str(conf), "-h",
                             f"ldap://127.0.0.1:{port}/ ldaps://127.0.0.1:{tls_port}/"],
                            stdout=log, stderr=subprocess.STDOUT)
    server = Slapd(folder, port, tls_port, proc)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"slapd exited ({proc.returncode}): {(folder / 'slapd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5), \
                    socket.create_connection(("127.0.0.1", tls_port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise AssertionError(f"slapd did not listen on {port} and {tls_port}: {(folder / 'slapd.log').read_text()}")


_slapd = servers.once(start_slapd)


@pytest.fixture
def directory():
    """The test session's slapd (started at the first test that asks for it, stopped as
    the session ends); its groups back as GROUP_ENTRIES says after the test."""
    server = _slapd()
    yield server
    server.reset_groups()


@pytest.fixture
def ldap_site(directory, monkeypatch, settings):
    """The site set up for the test's slapd, through GPUFLEET_LDAP_* as a deploy sets it
    (ROLE_GROUPS mapped, CONTACT to ask); call it again with other variables to change them."""
    from django.conf import settings as site

    from gpufleet.sso import ldap_settings
    from gpufleet.sso.groups import parse_role_groups

    def configure(**variables: str | None):
        for name in [name for name in os.environ if name.startswith("GPUFLEET_LDAP_")]:
            monkeypatch.delenv(name)
        for name, value in directory.environment(**variables).items():
            if value is not None:
                monkeypatch.setenv(name, value)
        for name, value in ldap_settings.read().items():
            setattr(settings, name, value)
        settings.AUTHENTICATION_BACKENDS = [*(b for b in site.AUTHENTICATION_BACKENDS if b != LDAP_BACKEND), LDAP_BACKEND]

    settings.GPUFLEET_SSO_ROLE_GROUPS = parse_role_groups(ROLE_GROUPS)
    settings.GPUFLEET_SSO_DEFAULT_ROLE = ""
    settings.GPUFLEET_SSO_CONTACT = CONTACT
    configure()
    return configure
