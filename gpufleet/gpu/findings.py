"""What the doctor says about a host: each finding's status (ok < warn < fail) and its
fix. Every module of the domain that diagnoses something builds its findings with these."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.gpu.remedies import CDI_GENERATE_COMMAND, INSTALL_COMMAND, PERSISTENCE_COMMAND


class Status(StrEnum):
    """Finding statuses, matching the doctor report's vocabulary. Declared in
    severity order: this order is the one ranking of ok < warn < fail."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        """0 for ok, 1 for warn, 2 for fail: sort by it, worst last."""
        return _STATUS_RANKS[self]

    @classmethod
    def worst(cls, statuses: Iterable[str]) -> Status:
        """The most severe of `statuses` (ok when there are none)."""
        return max((cls(s) for s in statuses), key=_STATUS_RANKS.__getitem__, default=cls.OK)


# Each status's rank, by the order they are declared in: asked for every finding of
# every snapshot the site stores.
_STATUS_RANKS = {status: rank for rank, status in enumerate(Status)}


# The fixes that are one shell command, to copy and run as they stand; every other fix
# is advice in words (which may quote a command among other steps).
COMMAND_FIXES = frozenset({INSTALL_COMMAND, CDI_GENERATE_COMMAND, PERSISTENCE_COMMAND})


def fix_is_command(fix: str) -> bool:
    """Whether a finding's fix (as stored or reported) is a command rather than advice."""
    return fix.strip() in COMMAND_FIXES


@dataclass(frozen=True)
class Finding:
    """One diagnosed aspect of a host's GPU setup. `fix` is a command or remedy, or empty."""

    code: str
    name: str
    status: Status
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        # Accept the plain strings too, and refuse anything outside the vocabulary.
        object.__setattr__(self, "status", Status(self.status))

    @property
    def fix_is_command(self) -> bool:
        return fix_is_command(self.fix)

    def to_dict(self) -> dict:
        return finding_dict(self.code, self.name, self.status, self.message, self.fix)


def finding_dict(code: str, name: str, status: str, message: str, fix: str) -> dict:
    """A finding as the doctor's JSON writes it (`fix` only when there is one), from its
    plain values, as the fleet exports read them."""
    data = {"code": code, "name": name, "status": str(Status(status)), "message": message}
    if fix:
        data["fix"] = fix
    return data
