"""Sending through apprise, and keeping its URLs secret. An apprise URL carries the
channel's credentials (an SMTP password, a webhook's token in its path), so nothing
derived from it leaves this module but its scheme: apprise's own log lines stay with
apprise, what it says of a failed send comes back with every part of the URL that
could be secret taken out, and so do the debug lines of the HTTP libraries under it
(`guard_logs`, from AlertsConfig.ready).

Where a send may go: a channel's Test would otherwise let its admin reach any address
the server can (`guard_destinations`)."""

from __future__ import annotations

import base64
import ipaddress
import itertools
import json
import logging
import re
import socket
import ssl
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import apprise
from django.conf import settings

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


def problem(url: str, format: str = "apprise") -> str | None:
    """Why a channel of `format` cannot use `url` (None when it can), in words that hold
    none of it: apprise must know an apprise URL; the Alertmanager format posts to a
    json(s):// or http(s):// URL."""
    if not _SCHEME.match(url.strip()):
        return "An apprise URL starts with its service, such as mailto:// or json://."
    if format == "alertmanager":
        if alertmanager_scheme(url) is None:
            return (f"Alertmanager's format is posted to an http://, https://, json:// or jsons:// URL, "
                    f"not {redact(url)}.")
        return None
    if apprise.Apprise.instantiate(url.strip()) is None:
        return (f"apprise cannot use this {redact(url)} URL: check the service's URL form "
                "in apprise's documentation.")
    return None


def send(url: str, title: str, body: str, notify_type: str = "info", fields: dict | None = None) -> Outcome:
    """Send one notification of apprise's `notify_type` (info, success, warning, failure:
    what a chat colours it by); what apprise said of a failure, with the secrets out, or
    which address `guard_destinations` refused. A JSON or form webhook (WEBHOOK_SCHEMES)
    given `fields` gets them beside apprise's title, message and type (`post`)."""
    if fields is not None and webhook_scheme(url):
        return _guarded(url, lambda: post(url, {"title": title, "message": body, "type": notify_type, **fields}))
    return _guarded(url, lambda: _through_apprise(url, title, body, notify_type))


def send_alertmanager(url: str, body: dict) -> Outcome:
    """Post Alertmanager's webhook `body` to a channel's json(s):// or http(s):// URL,
    as `send` does: guarded, and what comes back scrubbed."""
    return _guarded(url, lambda: post(url, body))


def _guarded(url: str, attempt) -> Outcome:
    guard = None if settings.GPUFLEET_ALERT_ALLOW_PRIVATE else _Guard(tuple(settings.GPUFLEET_ALERT_ALLOW_HOSTS))
    guarding = _guard.set(guard)
    try:
        with _sending(url):
            outcome = attempt()
    finally:
        _guard.reset(guarding)
    if not outcome.sent and guard is not None and guard.refused:
        return Outcome(False, "; ".join(dict.fromkeys(guard.refused)))
    return outcome


def _through_apprise(url: str, title: str, body: str, notify_type: str) -> Outcome:
    notifier = apprise.Apprise()
    if not notifier.add(url.strip()):
        return Outcome(False, problem(url) or "apprise cannot use this URL.")
    try:
        result = notifier.notify(body=body, title=title, body_format=apprise.NotifyFormat.TEXT,
                                 notify_type=apprise.NotifyType(notify_type))
    except Exception as exc:
        # A plugin's bug fails this send, not the sender and the deliveries after it.
        return Outcome(False, scrub(f"{type(exc).__name__}: {exc}", url))
    if result:
        return Outcome(True)
    said = scrub("; ".join(dict.fromkeys(entry.message for entry in result.logs())), url)
    return Outcome(False, said or "apprise reported a failure")


# --- JSON and form webhooks --------------------------------------------------------------

# apprise's webhook services whose body gpufleet writes itself (apprise's own is flat
# text), and the HTTP scheme each posts with.
WEBHOOK_SCHEMES = {"json": "http", "jsons": "https", "form": "http", "forms": "https"}
WEBHOOK_TIMEOUT_S = 10
_OFF = frozenset({"no", "false", "0", "off", "n"})


def webhook_scheme(url: str) -> str | None:
    """The HTTP scheme a JSON or form webhook URL posts with; None for any other URL."""
    match = _SCHEME.match(url.strip())
    return WEBHOOK_SCHEMES.get(match.group(1).lower()) if match else None


def alertmanager_scheme(url: str) -> str | None:
    """The HTTP scheme Alertmanager's format posts to `url` with (json:// and http:// with
    http); None for a URL it cannot be posted to."""
    match = _SCHEME.match(url.strip())
    scheme = match.group(1).lower() if match else ""
    return scheme if scheme in ("http", "https") else {"json": "http", "jsons": "https"}.get(scheme)


def post(url: str, body: dict) -> Outcome:
    """Post `body` to a json(s):// or form(s):// URL as apprise would read the URL: its
    user and password as basic auth, `+Header=value` as headers, `-name=value` as query
    arguments, `:key=value` as further body keys, `method=` and `verify=no`. A form gets
    the nested values (events, labels) as JSON text. A plain http(s):// URL is posted to
    as it is. Only under `_guarded`, which guards where it may go and scrubs what comes
    back."""
    parts = urlsplit(url.strip())
    headers, query, method, verify = {"User-Agent": "gpufleet"}, [], "POST", True
    body = dict(body)
    plain = parts.scheme.lower() in ("http", "https")
    # Split by hand as apprise does: parse_qsl would read the "+" of a header as a space.
    for pair in filter(None, "" if plain else parts.query.split("&")):
        key, _, value = (unquote(piece) for piece in pair.partition("="))
        if key.startswith("+"):
            headers[key[1:]] = value
        elif key.startswith("-"):
            query.append((key[1:], value))
        elif key.startswith(":") and value:
            body.setdefault(key[1:], value)
        elif key == "method":
            method = value.upper()
        elif key == "verify":
            verify = value.lower() not in _OFF
    if parts.scheme.lower().startswith("form"):
        data = urlencode({key: value if isinstance(value, str) else json.dumps(value) for key, value in body.items()})
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    else:
        data = json.dumps(body)
        headers["Content-Type"] = "application/json"
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    target = urlunsplit((alertmanager_scheme(url) or webhook_scheme(url), parts.netloc.rpartition("@")[2],
                         parts.path or "/", parts.query if plain else urlencode(query), ""))
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(target, data=data.encode(), headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S, context=context):
            return Outcome(True)
    except urllib.error.HTTPError as exc:
        return Outcome(False, scrub(f"the webhook answered {exc.code} {exc.reason}", url))
    except urllib.error.URLError as exc:
        return Outcome(False, scrub(f"the webhook could not be reached: {exc.reason}", url))
    except (OSError, ValueError) as exc:
        return Outcome(False, scrub(f"the webhook could not be reached: {type(exc).__name__}: {exc}", url))


def scrub(text: str, url: str) -> str:
    """`text` without anything of `url` that may be secret, in any letter case: the whole
    URL, its user and password, its host (some services take a key there, PagerDuty its
    routing key), each part of its path and each query value."""
    secrets = {url.strip(), url.strip().split("://", 1)[-1]}
    parts = urlsplit(url.strip())
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    host = hostport.rsplit(":", 1)[0] if not hostport.endswith("]") else hostport
    secrets.update({hostport, host, unquote(host), host.strip("[]")})
    if userinfo:
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
        text = re.sub(re.escape(secret), "…", text, flags=re.IGNORECASE)
    return text


# --- destinations ------------------------------------------------------------------------

_SETTINGS_ADVICE = ("set GPUFLEET_ALERT_ALLOW_PRIVATE=true, or list the host in GPUFLEET_ALERT_ALLOW_HOSTS, to let "
                    "alerts reach it")
# The socket operations that reach an address (Python's audit events: sys.addaudithook).
_REACHING = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})


@dataclass
class _Guard:
    allowed: tuple[str, ...]
    refused: list[str] = field(default_factory=list)


# Set while `send` runs; apprise runs a send on its worker threads in a copy of this context.
_guard: ContextVar[_Guard | None] = ContextVar("gpufleet_alert_guard", default=None)
_audit_hook_added = False


def guard_destinations() -> None:
    """Refuse every connection a send makes to a loopback, link-local, private or reserved
    address (unless allowed), checked on the address the socket is about to reach, after
    any name was resolved, so a name that resolves there (or is made to later) is refused
    too. Once per process: an audit hook cannot be removed."""
    global _audit_hook_added
    if not _audit_hook_added:
        sys.addaudithook(_check_destination)
        _audit_hook_added = True


def _check_destination(event: str, args: tuple) -> None:
    if event not in _REACHING:
        return
    guard = _guard.get()
    if guard is None or args[1] is None:
        return
    why = refusal(args[1], guard.allowed)
    if why is not None:
        guard.refused.append(why)
        raise PermissionError(why)


def refusal(address, allowed: tuple[str, ...] = ()) -> str | None:
    """Why a send may not reach the socket address `address` (None when it may). A host
    name (UDP syslog sends to one) is resolved here and every address of it checked."""
    if not isinstance(address, tuple):
        return f"refused to send through a local socket: {_SETTINGS_ADVICE}"
    for ip in _addresses(str(address[0])):
        kind = _private_kind(ip)
        if kind and not _allowed(ip, allowed):
            return f"refused to send to {ip}, a {kind} address: {_SETTINGS_ADVICE}"
    return None


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host.split("%", 1)[0])]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return []  # the library's own look-up fails the same way
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found]


def _private_kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_private:
        return "private"
    if ip.is_multicast or ip.is_reserved or ip.is_unspecified or not ip.is_global:
        return "reserved"
    return None


def _allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allowed: tuple[str, ...]) -> bool:
    for entry in allowed:
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            if ip in _addresses(entry):
                return True
    return False


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
