"""Every command the README and docs/ show is run by a test, or says here why none can.

Their code blocks are read with a CommonMark parser. A block is configuration
(not shell), a block no test can run (with the reason), or shell whose every command
line maps to the test that runs it; tests that run a documented command take it from here
(`readme_command`, `readme_commands`), so the documents and what is tested cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]

# Blocks that are not commands, by how their first line starts.
NOT_SHELL = ("gpufleet/gpu/ ", "location / {", "scrape_configs:", "# /etc/gpufleet/central.env", "{")

# Blocks no test runs, by their first line, and why.
NOT_RUN = {
    "sh gpufleet/bootstrap up": "installs system packages as root, then runs `manage.py up`, which "
    "tests/integration/test_up.py runs",
    "sh gpufleet/bootstrap test": "it is the command that runs this suite: .ci/run runs it",
    "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test CELERY_BROKER_URL=redis://127.0.0.1:6379/0 "
    "sh gpufleet/bootstrap test": "the command that runs this suite, on CI's services: .ci/run runs it so",
    "# central host (Debian 12 or later), as root": "a deployment as root on fresh hosts; "
    "tests/core/test_deploy_units.py checks the units and environment files it installs",
    'curl -H "Authorization: Bearer gpf_…" http://127.0.0.1:8000/api/nodes/': "a token placeholder and a "
    "running site; tests/api/test_token_auth.py sends the same requests with a real token",
    "docker run --gpus": "needs a GPU host with Docker; the browser journeys store the containers it labels",
    "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test CELERY_BROKER_URL=redis://127.0.0.1:6379/0 "
    ".venv/bin/python manage.py bench --nodes ": "minutes on a PostgreSQL of thousands of nodes; "
    "tests/ingest/test_bench.py runs the same command at 20 nodes",
    ".venv/bin/python manage.py createsuperuser": "Django's own command, which asks for a password; "
    "tests/sso/test_sign_in.py logs the break-glass superuser in as made by create_superuser, what it calls",
    "git pull && .venv/bin/pip install -r requirements.txt": "upgrades a deployed site in place, as root; "
    "tests/core/test_deploy_units.py checks the units it restarts",
    "install -m 640 -g gpufleet /dev/null /etc/gpufleet/ldap-bind-password": "writes under /etc as root for "
    "the gpufleet group; tests/sso/test_ldap_settings.py reads a bind password from a file",
}

_DEMO = "tests/integration/test_up.py::test_the_readme_demo_runs_as_shown_and_up_prints_each_line_once"
# Each command line of the other blocks, and the test that runs it.
RUN_BY = {
    "PATH=$PWD/tests/fakes/bin:$PATH fake-dockerd .venv/bin/python manage.py up --agent demo-1 --agent demo-2": _DEMO,
    "sh gpufleet/demo-agent demo-a40 smi-8x-a40-with-units.csv": _DEMO,
    "sh gpufleet/demo-agent demo-h100 health/smi-8x-h100-failing.csv": _DEMO,
    "LDAPTLS_CACERT=/etc/gpufleet/ldap-ca.pem ldapsearch -ZZ -H ldap://ldap.example.org -D "
    '"cn=gpufleet,ou=services,dc=example,dc=org" -y /etc/gpufleet/ldap-bind-password -b "ou=groups,dc=example,dc=org" '
    '"(member=uid=alice,ou=people,dc=example,dc=org)" dn':
    "tests/sso/test_ldap_login.py::test_the_documented_group_search_finds_the_persons_groups",
}


def documents() -> list[Path]:
    """The README and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def readme_blocks() -> list[list[str]]:
    """The code blocks of the README and docs/, each as its lines with backslash continuations joined."""
    parser = MarkdownIt("commonmark")
    tokens = [t for page in documents() for t in parser.parse(page.read_text(encoding="utf-8"))]
    return [re.sub(r"\\\n\s*", "", t.content).splitlines() for t in tokens if t.type in ("code_block", "fence")]


def _commands(block: list[str]) -> list[str]:
    return [line.strip() for line in block if line.strip() and not line.strip().startswith("#")]


def readme_commands(start: str) -> list[str]:
    """The documented command lines that start with `start`, at least one."""
    found = [c for block in readme_blocks() for c in _commands(block) if c.startswith(start)]
    assert found, f"the README and docs/ have no command starting with {start!r}"
    return found


def readme_command(start: str) -> str:
    """The one documented command line that starts with `start`."""
    found = readme_commands(start)
    assert len(found) == 1, f"the README and docs/ have {len(found)} commands starting with {start!r}"
    return found[0]


def test_every_readme_command_is_run_by_a_test_or_says_why_not():
    unaccounted = []
    for block in readme_blocks():
        first = block[0].strip()
        if first.startswith(NOT_SHELL) or any(first.startswith(k) for k in NOT_RUN):
            continue
        unaccounted += [c for c in _commands(block) if c not in RUN_BY]
    assert not unaccounted, f"documented commands no test runs (add a test to RUN_BY, or a reason to NOT_RUN): {unaccounted}"


def test_the_tests_named_for_readme_commands_exist():
    for node_id in set(RUN_BY.values()):
        path, name = node_id.split("::")
        assert f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), node_id


def test_each_command_mapped_to_a_test_is_documented():
    documented = {c for block in readme_blocks() for c in _commands(block)}
    assert not set(RUN_BY) - documented, sorted(set(RUN_BY) - documented)


def test_each_reason_not_to_run_names_a_block_the_documents_have():
    firsts = [block[0].strip() for block in readme_blocks()]
    for start in NOT_RUN:
        assert any(f.startswith(start) for f in firsts), start


def test_an_unaccounted_command_fails(monkeypatch):
    monkeypatch.setattr(
        "tests.test_readme.readme_blocks", lambda: [["sh gpufleet/demo-agent demo-a40 smi-8x-a40-with-units.csv"],
                                                    ["rm -rf var/"]]
    )
    try:
        test_every_readme_command_is_run_by_a_test_or_says_why_not()
    except AssertionError as exc:
        assert "rm -rf var/" in str(exc) and "demo-a40" not in str(exc)
    else:
        raise AssertionError("an unaccounted README command passed")
