"""The package order of docs/architecture.md, enforced: every `import gpufleet.X` in the
code points downwards (or within its own package). Lower layers first:

    gpu                      the domain; imports nothing of gpufleet
    core                     plumbing (access, roles, htmx, settings helpers, the Celery app)
    wire                     the agent<->central message
    agent                    the node side; never a model
    audit < events < fleet < teams < claims, jobs
                             the apps: a claim and a job are on a node, a claim is a
                             team's, and every app may write audit rows and events (the
                             fleet's memory, which names nodes and jobs only by model
                             label); claims and jobs never import each other
    usage                    GPU time added up: reads nodes and claims, releases idle ones
    alerts                   above them all: reads events (and nodes), sends on the
                             central beat; nothing below imports it, nor does ingest
    sso                      single sign-on: users, their roles and their teams from a
                             directory's groups, audited; nothing below imports it
    ingest, api              the top: may use every app
    tools                    the bench, the simulated fleet and their helpers, with their
                             commands `bench` and `simulate`: may use everything, and
                             nothing imports them

The project modules (settings, urls, wsgi, asgi) sit above everything."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpufleet"

LAYERS = {
    "gpu": (0, 0),
    "env": (1, 0),
    "celery_common": (1, 0),
    "celery": (1, 1),
    "core": (1, 2),
    "wire": (2, 0),
    "agent": (3, 0),
    "audit": (4, 0),
    "events": (4, 1),
    "fleet": (4, 2),
    "teams": (4, 3),
    "claims": (4, 4),
    "jobs": (4, 4),
    "usage": (4, 5),
    "alerts": (4, 6),
    "sso": (4, 7),
    "ingest": (5, 0),
    "api": (5, 0),
    "tools": (6, 0),
    "settings": (9, 0),
    "urls": (9, 0),
    "wsgi": (9, 0),
    "asgi": (9, 0),
}




def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "gpufleet" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpufleet":
                found += [(node.lineno, f"gpufleet.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] == "__init__.py":
            continue
        yield relative.parts[0].removesuffix(".py"), path


def _allowed(source: str, target: str) -> bool:
    if source == target:
        return True
    (s_layer, s_rank), (t_layer, t_rank) = LAYERS[source], LAYERS[target]
    if s_layer != t_layer:
        return t_layer < s_layer
    return t_rank < s_rank  # within a layer: audit < events < fleet < teams < claims, jobs; env < celery < core


def test_every_package_has_a_place_in_the_order():
    assert sorted({package for package, _ in _modules()} - set(LAYERS)) == []


def test_the_order_names_only_packages_there_are():
    assert sorted(set(LAYERS) - {package for package, _ in _modules()}) == []


@pytest.mark.parametrize("package,path", list(_modules()), ids=lambda v: str(v).rsplit("gpufleet/", 1)[-1])
def test_imports_run_downwards(package, path):
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {module}"
        for line, module in _imports(path)
        if (target := _package(module)) is not None and not _allowed(package, target)
    ]
    assert wrong == []


def test_nothing_outside_the_tools_imports_them():
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {module}"
        for package, path in _modules()
        if package != "tools"
        for line, module in _imports(path)
        if _package(module) == "tools"
    ]
    assert wrong == []


def test_ingest_never_imports_the_alerts():
    # Alerts are sent by the central beat, never on the ingest queue (docs/alerts.md).
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {module}"
        for package, path in _modules()
        if package == "ingest"
        for line, module in _imports(path)
        if _package(module) == "alerts"
    ]
    assert wrong == []


def test_the_agent_never_imports_a_model():
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {module}"
        for package, path in _modules()
        if package == "agent"
        for line, module in _imports(path)
        if module.endswith(".models") or module.startswith("django.db")
    ]
    assert wrong == []


def test_the_order_test_catches_a_wrong_import():
    assert not _allowed("fleet", "claims") and not _allowed("claims", "jobs") and not _allowed("gpu", "core")
    assert _allowed("claims", "fleet") and _allowed("ingest", "claims") and _allowed("wire", "gpu")


# The host's modules and calls that the domain leaves to the agent (gpufleet/agent/adapters.py).
HOST_MODULES = {"subprocess", "docker", "os", "shutil", "socket", "pathlib", "requests", "urllib3", "signal", "threading"}
HOST_CALLS = {"open"}


def _host_access(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found += [f"{path.name}:{node.lineno} imports {name}" for name in names if name.split(".")[0] in HOST_MODULES]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in HOST_CALLS:
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


def test_the_domain_does_no_io():
    wrong = [problem for path in sorted((ROOT / "gpu").rglob("*.py")) for problem in _host_access(path)]
    assert wrong == []


def test_the_io_check_catches_a_subprocess_and_a_file(tmp_path):
    module = tmp_path / "sneaky.py"
    module.write_text("import subprocess\nfrom os import path\n\ndef f():\n    return open('/proc/1/cgroup').read()\n")
    assert _host_access(module) == [
        "sneaky.py:1 imports subprocess", "sneaky.py:2 imports os", "sneaky.py:5 calls open()",
    ]
