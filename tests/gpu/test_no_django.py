"""The domain package stays importable without Django."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufleet.gpu

PACKAGE = Path(gpufleet.gpu.__file__).parent


def test_it_imports_no_django():
    imported = set()
    for module in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert "gpufleet" in imported  # the scan sees the package's own imports
    assert "django" not in imported
