"""Telling a claim's owner: plain-text email through Django's mail (the GPUFLEET_EMAIL_*
settings), and absolute links into the site for it. With no mail server set nothing is
sent; the events the beat records still reach the alert channels."""

from __future__ import annotations

import logging
import smtplib

from django.conf import settings
from django.core.mail import send_mail

log = logging.getLogger(__name__)

NO_SERVER = "no mail server is set (GPUFLEET_EMAIL_HOST)"
NO_ADDRESS = "the owner has no email address"


def address(user) -> str:
    """Where a user is reached by email: their address, if they are an active user with one."""
    if user is None or not user.is_active:
        return ""
    return (user.email or "").strip()


def send(to: str, subject: str, body: str) -> str:
    """Send one email to `to`; "" once the server took it, else why it was not sent."""
    if not settings.EMAIL_HOST:
        return NO_SERVER
    if not to:
        return NO_ADDRESS
    try:
        send_mail(subject, body, None, [to])
    except (OSError, smtplib.SMTPException) as exc:
        # The server's own words: they name no password (the login is SMTP AUTH's).
        return f"{type(exc).__name__}: {exc}"[:500]
    return ""


def tell_owner(claim, subject: str, body: str) -> None:
    """Email the owner of `claim`; a server that did not take it is logged, no server is not."""
    error = send(address(claim.owner), subject, body)
    if error and error != NO_SERVER:
        log.warning("could not email the owner of claim %s on %s: %s", claim.name, claim.node.name, error)


def link(path: str) -> str:
    """`path` on the site as people reach it (GPUFLEET_SITE_URL)."""
    return settings.GPUFLEET_SITE_URL.rstrip("/") + path


def hours(value: float) -> str:
    """GPU-hours as people read them: one decimal."""
    return f"{value:,.1f}"
