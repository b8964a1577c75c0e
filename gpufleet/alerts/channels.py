"""Sending through apprise, and keeping its URLs secret. An apprise URL carries the
channel's credentials (an SMTP password, a webhook's token in its path), so nothing
derived from it leaves this module but its scheme: apprise's own log lines stay with
apprise, what it says of a failed send comes back with every part of the URL that
could be secret taken out, and so do the debug lines of the HTTP libraries under it
(`guard_logs`, from AlertsConfig.ready)."""

from __future__ import annotations

import itertools
import logging
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

import apprise

# Parts of a URL shorter than this are left in an error text (a port, "json", "to"):
# replacing them would garble the message and hide nothing worth hiding.
_SHORTEST_SECRET = 4
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)


@dataclass(frozen=True)
class Outcome:
    sent: bool
    error: str = ""


def redact(url: str) -> str:
    """What pages and the API show of a channel's URL: its scheme, never more."""
    match = _SCHEME.match(url.strip())
    return f"{match.group(1).lower()}://…" if match else "…"


def problem(url: str) -> str | None:
    """Why apprise cannot use `url` (None when it can), in words that hold none of it."""
    if not _SCHEME.match(url.strip()):
        return "An apprise URL starts with its service, such as mailto:// or json://."
    if apprise.Apprise.instantiate(url.strip()) is None:
        return (f"apprise cannot use this {redact(url)} URL: check the service's URL form "
                "in apprise's documentation.")
    return None


def send(url: str, title: str, body: str) -> Outcome:
    """Send one notification; what apprise said of a failure, with the secrets out."""
    notifier = apprise.Apprise()
    with _sending(url):
        if not notifier.add(url.strip()):
            return Outcome(False, problem(url) or "apprise cannot use this URL.")
        try:
            result = notifier.notify(body=body, title=title, body_format=apprise.NotifyFormat.TEXT)
        except Exception as exc:
            # A plugin's bug fails this send, not the sender and the deliveries after it.
            return Outcome(False, scrub(f"{type(exc).__name__}: {exc}", url))
    if result:
        return Outcome(True)
    said = "; ".join(dict.fromkeys(entry.message for entry in result.logs())) or "apprise reported a failure"
    return Outcome(False, scrub(said, url))


def scrub(text: str, url: str) -> str:
    """`text` without anything of `url` that may be secret: the whole URL, its user and
    password, each part of its path and each query value, and the host only where it
    sits inside a longer secret (hosts are left: an error naming the host helps)."""
    secrets = {url.strip(), url.strip().split("://", 1)[-1]}
    parts = urlsplit(url.strip())
    netloc = parts.netloc
    if "@" in netloc:
        userinfo = netloc.rsplit("@", 1)[0]
        secrets.add(userinfo)
        secrets.update(unquote(piece) for piece in userinfo.split(":", 1))
        secrets.update(userinfo.split(":", 1))
    path = parts.path
    secrets.add(path)
    secrets.update(segment for segment in path.split("/"))
    secrets.update(unquote(segment) for segment in path.split("/"))
    for _, value in parse_qsl(parts.query, keep_blank_values=True):
        secrets.add(value)
    for secret in sorted((s for s in secrets if len(s) >= _SHORTEST_SECRET), key=len, reverse=True):
        text = text.replace(secret, "…")
    return text


# --- logs ------------------------------------------------------------------------------

# The loggers of the libraries apprise sends with, which name the URLs they reach (a
# webhook's token is in its path) in their debug lines.
LIBRARY_LOGGERS = ("urllib3.connectionpool", "urllib3.connection", "urllib3.poolmanager", "urllib3.util.retry",
                   "urllib3.response", "requests_oauthlib", "oauthlib")
_in_flight: dict[int, str] = {}
_in_flight_lock = threading.Lock()
_send_numbers = itertools.count()


@contextmanager
def _sending(url: str):
    with _in_flight_lock:
        key = next(_send_numbers)
        _in_flight[key] = url
    try:
        yield
    finally:
        with _in_flight_lock:
            del _in_flight[key]


class _Scrub(logging.Filter):
    """Takes the secrets of every URL being sent now out of a library's log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        with _in_flight_lock:
            urls = list(_in_flight.values())
        if urls:
            text = record.getMessage()
            for url in urls:
                text = scrub(text, url)
            record.msg, record.args = text, ()
        return True


def guard_logs() -> None:
    """Keep apprise's lines with apprise (it hands each send's warnings back to `send`)
    and scrub the HTTP libraries' lines while a send is in flight. Once per process."""
    library = logging.getLogger("apprise")
    library.propagate = False
    library.disabled = False
    if not library.handlers:
        library.addHandler(logging.NullHandler())
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Scrub) for f in logger.filters):
            logger.addFilter(_Scrub())
