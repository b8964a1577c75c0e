"""gpufleet uses no private name of Celery, kombu or any other dependency: upgrades
of those may rename or drop anything private without notice (a batching worker once
leaned on `_buffer`, `_do_flush`, `_tref`, `_pool`, kombu's unacked index and
`message._state`). Read from the source with ast: an import of a `_name` from outside
gpufleet, or an attribute `._name` that gpufleet itself does not define, fails."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpufleet"
# Underscored names that are their libraries' documented API.
DOCUMENTED = {
    "_meta",  # Django's Model._meta (the Options API)
    "_replace", "_asdict", "_fields",  # namedtuple
}
# gpufleet's own underscored attributes that it sets on another library's object.
OWN_ON_OTHERS = {
    "_account_before",  # gpufleet/core/admin.py: on the request, between get_object and log_change
}
GONE = ("celery_batches",)  # dependencies removed: not even imported


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _defined(trees) -> set[str]:
    """Every name gpufleet defines: functions, classes, assignments, attributes it sets on
    its own objects (self, cls), parameters. (A subclass setting its base's private
    attribute on self is beyond this check: review catches that.)"""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def uses_of_private_names(trees) -> list[str]:
    own = _defined(trees) | OWN_ON_OTHERS
    found = []
    for path, tree in trees.items():
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("gpufleet"):
                module = node.module or ""
                if module.split(".")[0] in GONE or any(_private(part) for part in module.split(".")):
                    found.append(f"{where}:{node.lineno} imports from {module}")
                found += [f"{where}:{node.lineno} imports {module}.{a.name}" for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Import):
                found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.split(".")[0] in GONE or any(_private(p) for p in a.name.split("."))]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own | DOCUMENTED:
                found.append(f"{where}:{node.lineno} uses .{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value) and node.args[1].value not in own | DOCUMENTED):
                found.append(f"{where}:{node.lineno} uses {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_gpufleet_uses_no_private_name_of_a_dependency():
    assert uses_of_private_names(_trees()) == []


def test_the_check_finds_what_the_batching_worker_used():
    # What the ingest's Celery tasks and worker pool did before the ingest stream.
    before = ast.parse(
        "from celery_batches import Batches\n"
        "from kombu.transport.virtual import QoS\n"
        "self._tref = consumer.timer.call_repeatedly(1, f)\n"
        "consume_queue(self._buffer)\n"
        "request.message._state = 'ACK'\n"
        "getattr(pool, '_pool', None)\n"
        "from celery.app.base import _after_fork_cleanup_app\n"
    )
    found = uses_of_private_names({PACKAGE / "example.py": before})
    # All but self._tref, which reads as an attribute of gpufleet's own.
    assert sorted(int(line.split(":")[1].split()[0]) for line in found) == [1, 4, 5, 6, 7], found
