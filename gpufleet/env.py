"""Reading settings from the environment: bad values fail loudly at start-up,
naming the variable, instead of surfacing later as odd behaviour."""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
import string
from collections import Counter
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingError(RuntimeError):
    pass


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean (use true or false)")


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise SettingError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a whole number") from None
    if minimum is not None and value < minimum:
        raise SettingError(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_prices(name: str) -> dict[str, float]:
    """Prices by name, "NAME=PRICE" separated by semicolons (GPU model names hold
    spaces and commas); the name "*" is the price of every other one."""
    raw = os.environ.get(name, "")
    prices = {}
    for part in (p.strip() for p in raw.split(";")):
        if not part:
            continue
        named, equals, price = part.rpartition("=")
        try:
            value = float(price)
        except ValueError:
            value = -1.0
        if not equals or not named.strip() or value < 0 or value != value:
            raise SettingError(f"{name}: {part!r} is not NAME=PRICE with a price of 0 or more")
        prices[named.strip()] = value
    return prices


def env_networks(name: str) -> list[str]:
    """A comma-separated list of IP addresses or CIDR networks; none by default."""
    values = env_list(name, [])
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise SettingError(f"{name}: {value!r} is not an IP address or CIDR") from None
    return values


# Django's own deploy check (security.W009) asks as much of SECRET_KEY.
SECRET_MIN_LENGTH = 50
# Anyone holding one node's key can test guesses of the site's key offline against it.
SECRET_MIN_BITS = 128
KEY_COMMAND = "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)
_OTHER_CHARACTERS = len(string.punctuation) + 1  # and the space


def estimated_bits(key: str) -> float:
    """A cautious estimate of the entropy in `key`: each character that does not repeat
    what came before (the three characters ending at it not seen earlier in the key) is
    worth the lesser of its character classes' bits and the key's own spread of
    characters (their Shannon entropy). A key said twice is worth once."""
    if not key:
        return 0.0
    pool = sum(len(chars) for chars in _CLASSES if any(c in chars for c in key))
    pool += _OTHER_CHARACTERS if any(not any(c in chars for chars in _CLASSES) for c in key) else 0
    spread = -sum(n / len(key) * math.log2(n / len(key)) for n in Counter(key).values())
    seen: set[str] = set()
    for end in range(1, len(key) + 1):
        seen.add(key[max(0, end - 3):end])
    return len(seen) * min(math.log2(pool), spread)


def require_strong_secret(name: str, value: str) -> None:
    """Refuse a production secret that could be guessed, without ever showing it."""
    if len(value) < SECRET_MIN_LENGTH or estimated_bits(value) < SECRET_MIN_BITS:
        raise SettingError(
            f"{name} is too weak for production: it needs at least {SECRET_MIN_LENGTH} characters and about "
            f"{SECRET_MIN_BITS} bits of entropy, a repeated or little varied key counting for little "
            f"(make one with: {KEY_COMMAND})"
        )


def local_secret_key(path: Path) -> str:
    """The key kept in `path`, created on first use with owner-only permissions."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


def read_private_text(path: Path) -> str:
    """The text kept in `path` (see write_private_text), or "" when there is none."""
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def write_private_text(path: Path, text: str) -> None:
    """Keep `text` in `path`, readable by this user only, replacing what was there at once
    (a reader sees the old text or the new one, never half of either)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(partial, path)
