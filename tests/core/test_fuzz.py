"""Hostile input on every URL of the site answers 2xx, 3xx or 4xx, never 5xx.

Every URL pattern (walked from the resolver, the admin's too, so a new page is fuzzed
without an entry here) is requested by an anonymous user, a viewer and an admin, with
CSRF checks on and a valid token, as GET and as POST: its path arguments replaced by
generated segments (NUL and other control characters, unicode, very long text, "..",
%-escapes), its query and body made of the field names of the site's forms, filter sets
and API schemas (on an admin page, its model's fields) with generated values.

Bounded for the suite: one fixed sweep of every pattern, then 250 generated requests
(GPUFLEET_FUZZ_EXAMPLES for more); no deadline (a busy machine is slow, not wrong) and
no example database (nothing written into the checkout)."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import quote, urlencode

import django_filters
import pytest
from django import forms
from django.apps import apps
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLResolver, get_resolver
from django.urls.resolvers import RoutePattern
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.api.schemas import ClaimIn, ClaimUpdate
from gpufleet.jobs.models import Job, JobKind
from tests.claims.helpers import claim
from tests.factories import ingest

pytestmark = pytest.mark.fuzz

CSRF = "fuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzz"  # any 32 letters make a valid CSRF secret
NODE = "alpha"
# Path segments that broke, or could break, something: PostgreSQL refuses NUL in text,
# integers overflow 64 bits, and unicode and escapes pass the resolver differently.
HOSTILE_SEGMENTS = [
    "a\x00b", "\x00", "\x01", "\x7f", "%00", "%2e%2e", "..", "../..", "./", "%", "%zz",
    "x" * 300, "y" * 5000, "ü€😀", "\u202e", "\ud7ff", " ", "-1", "0", "99999999999999999999",
    "1e3", "NaN", "null", "<script>", "'\"", "a b", "a;b", "*", NODE,
]
HOSTILE_VALUES = [
    *HOSTILE_SEGMENTS, "", "on", "yes", "true", "2026-13-45T25:61", "1970-01-01T00:00",
    "9999-12-31T23:59", "-9223372036854775809", "1.5", "0x10", "gpu0", "GPU-", "admin", "ada",
]


def _template(pattern) -> tuple[str, list[tuple[str, ...]]]:
    """One pattern as text with `{}` where each path argument goes (`<conv:name>` of a
    path(), a group of a re_path()), and for each the literal choices its group allows
    (`json|csv|md`), if any."""
    route = str(pattern)
    if isinstance(pattern, RoutePattern):
        return re.sub(r"<(?:\w+:)?\w+>", "{}", route), [()] * len(re.findall(r"<(?:\w+:)?\w+>", route))
    out, slots, i = [], [], 0
    while i < len(route):
        if route.startswith("(", i) or route.startswith(".*", i):
            start, depth = i, 0
            while route[i] in "(" or depth:
                depth += {"(": 1, ")": -1}.get(route[i], 0)
                i += 1
            group = route[start:i] if i > start else ".*"
            i += 2 if group == ".*" else 0
            body = re.sub(r"^\(\?P<\w+>|\)$", "", group)
            slots.append(tuple(body.split("|")) if re.fullmatch(r"[\w|-]+", body) else ())
            out.append("{}")
        elif route[i] == "\\" and i + 1 < len(route):
            out.append(route[i + 1])
            i += 2
        elif route[i] in "^$":
            i += 1
        else:
            out.append(route[i])
            i += 1
    return "".join(out), slots


def _patterns() -> list[tuple[str, list[tuple[str, ...]]]]:
    """(template, slots) for every URL pattern of the site."""
    found = {}

    def walk(patterns, prefix: str, slots: list) -> None:
        for p in patterns:
            text, more = _template(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + text, slots + more)
            else:
                found["/" + prefix + text] = slots + more

    walk(get_resolver().url_patterns, "", [])
    return sorted(found.items())


def _field_names() -> list[str]:
    """The fields of every form and filter set of the site, login's and the API's bodies."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    names = set(AuthenticationForm.base_fields)
    for form in subclasses(forms.BaseForm):
        if form.__module__.startswith("gpufleet."):
            names |= set(getattr(form, "base_fields", {}))
    for filterset in subclasses(django_filters.FilterSet):
        if filterset.__module__.startswith("gpufleet."):
            names |= set(filterset.base_filters)
    names |= set(ClaimIn.model_fields) | set(ClaimUpdate.model_fields)
    # Read straight from request.GET by views and the API.
    names |= {"page", "range", "partial", "node", "format", "problems", "next", "q", "sort"}
    return sorted(names)


ADMIN_PARAMETERS = ["o", "p", "q", "all", "e", "action", "_selected_action", "select_across", "index", "_to_field"]


def _keys(template: str) -> list[str]:
    """The parameter names worth trying on a pattern: the site's form fields, and on an
    admin page its model's fields (its lists filter and sort by them) and the admin's own."""
    found = re.match(r"/admin/(\w+)/(\w+)/", template)
    if not found:
        return FIELDS
    try:
        model = apps.get_model(found[1], found[2])
    except LookupError:
        return ADMIN_PARAMETERS
    lookups = ("", "__exact", "__gte", "__id__exact", "__isnull")
    return ADMIN_PARAMETERS + [f"{field.name}{lookup}" for field in model._meta.fields for lookup in lookups]


PATTERNS = _patterns()
FIELDS = _field_names()

segments = st.one_of(
    st.sampled_from(HOSTILE_SEGMENTS),
    st.text(min_size=1, max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
values = st.one_of(
    st.sampled_from(HOSTILE_VALUES),
    st.just("a\x00b"),
    st.text(max_size=60),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


def _params(keys: list[str]):
    return st.dictionaries(
        st.one_of(st.sampled_from(keys), st.text(min_size=1, max_size=10)),
        st.one_of(values, st.lists(values, min_size=1, max_size=3)),
        max_size=6,
    )


json_bodies = st.one_of(
    st.dictionaries(
        st.sampled_from(sorted(set(ClaimIn.model_fields) | set(ClaimUpdate.model_fields))),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=30) | st.sampled_from(HOSTILE_VALUES),
            lambda inner: st.lists(inner, max_size=3),
            max_leaves=5,
        ),
        max_size=6,
    ),
    st.text(max_size=30).map(json.dumps),
)


# Our pages as often as Django's admin (most patterns), logged in more often than not
# (anonymous requests only reach the login page), reads more often than writes.
patterns = st.one_of(
    st.sampled_from([p for p in PATTERNS if not p[0].startswith("/admin/")]),
    st.sampled_from([p for p in PATTERNS if p[0].startswith("/admin/")]),
)
roles = st.sampled_from(["anonymous", "viewer", "viewer", "admin", "admin", "admin"])
methods = st.sampled_from(["get", "get", "post", "post-json"])


@pytest.fixture
def site(db, django_user_model, sent_tasks) -> dict:
    """The fleet the pages show; the users (anonymous, viewer, admin); the path segments
    that name real objects, so the fuzzer gets past the lookups too."""
    node = ingest(NODE, 2, fixes=["cdi"])
    held = claim(node, "train", count=1)
    job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE)
    users = {"anonymous": None}
    for role in ("viewer", "admin"):
        user = django_user_model.objects.create_user(username=f"fuzz-{role}", password="x")
        user.groups.add(Group.objects.get(name=role))
        users[role] = user
    real = [NODE, "cdi", "0", "1", str(node.pk), str(held.pk), str(job.pk), str(users["admin"].pk), "fleet/node"]
    return {"users": users, "real": real}


def _client(user) -> Client:
    """Fresh each request: a fuzzed POST may log the user out (or in). A view's exception
    comes back as the 500 the user would get (its traceback is in the captured log)."""
    client = Client(enforce_csrf_checks=True, raise_request_exception=False, HTTP_X_CSRFTOKEN=CSRF)
    client.cookies["csrftoken"] = CSRF
    if user is not None:
        client.force_login(user)
    return client


def _path(template: str, parts: list[tuple[str, bool]]) -> str:
    """The template with each segment, %-escaped or raw (raw "%00" reaches Django as NUL)."""
    return template.format(*(quote(text, safe="") if escape else text for text, escape in parts))


def _slot(choices: tuple[str, ...], real: list[str]):
    return st.tuples(st.one_of(st.sampled_from(choices or real), st.sampled_from(real), segments), st.booleans())


def test_every_pattern_answers_each_role_and_method_with_a_nul_or_a_huge_segment(site):
    """The fixed worst cases, deterministic: every pattern, each role, GET and POST, its
    arguments a NUL (and, as the admin, 5,000 characters)."""
    failures = []
    for template, slots in PATTERNS:
        cases = [(role, method, "a%00b") for role in site["users"] for method in ("get", "post")]
        if slots:
            cases += [("admin", method, "y" * 5000) for method in ("get", "post")]
        for role, method, segment in cases:
            path = _path(template, [(segment, False)] * len(slots))
            body = {"csrfmiddlewaretoken": CSRF} if method == "post" else {}
            response = getattr(_client(site["users"][role]), method)(path, body)
            if response.status_code >= 500:
                failures.append((role, method, path[:80], response.status_code))
    assert not failures, "\n".join(map(str, failures))


@settings(
    # GPUFLEET_FUZZ_EXAMPLES=5000 for a longer hunt than the suite's.
    max_examples=int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", "250")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_url_answers_a_server_error(site, data):
    template, slots = data.draw(patterns, label="pattern")
    parts = [data.draw(_slot(choices, site["real"]), label="segment") for choices in slots]
    path = _path(template, parts)
    role = data.draw(roles, label="role")
    method = data.draw(methods, label="method")
    keys = _keys(template)
    query = data.draw(_params(keys), label="query")
    client = _client(site["users"][role])
    url = f"{path}?{urlencode(query, doseq=True)}" if query else path
    if method == "get":
        response = client.get(url)
    elif method == "post":
        response = client.post(url, {**data.draw(_params(keys), label="form"), "csrfmiddlewaretoken": CSRF})
    else:
        body = data.draw(json_bodies, label="json")
        response = client.post(url, body if isinstance(body, str) else json.dumps(body), content_type="application/json")
    assert response.status_code < 500, (role, method, url, response.status_code)
