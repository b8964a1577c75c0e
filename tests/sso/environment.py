"""The environment a settings reader of single sign-on sees, set by a test."""

from __future__ import annotations

import os
from collections.abc import Callable


def only(monkeypatch, prefix: str, good: dict[str, str]) -> Callable[..., None]:
    """Clear every variable starting with `prefix` (and production), and give back a setter:
    set_(NAME=value, ...) sets `good` with those changed, a None value unsetting its name."""
    for name in [name for name in os.environ if name.startswith(prefix)]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("GPUFLEET_PRODUCTION", raising=False)

    def set_(**values):
        for name, value in {**good, **values}.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    return set_
