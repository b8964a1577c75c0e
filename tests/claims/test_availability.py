"""Seeing when GPUs are free: the node's calendar, the fleet's free GPUs per model, and
"find a slot", from nodes that came in through ingest and claims saved through the services."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from tests.claims.helpers import HTMX, NOW, TUESDAY_9, TUESDAY_17, make_node, uuid
from tests.factories import gpu_uuid, snapshot

pytestmark = pytest.mark.django_db


def book(node: Node, name: str, user, start, end, count: int = 0, gpus=()) -> Claim:
    proposed = gpu.Claim(name=name, count=count, device_ids=tuple(uuid(node, i) for i in gpus))
    return services.save_claim(node, proposed, user, terms=services.Terms(owner=user, starts_at=start, ends_at=end))


def lines(html: str) -> dict[str, list[tuple[int, str, str]]]:
    """The calendar's lines by title: each cell's hours, class and text."""
    found = {}
    for title, row in re.findall(r'<th scope="row"[^>]*>(.*?)</th>(.*?)</tr>', html, re.S):
        found[unescape(title)] = [
            (int(span), cls, unescape(re.sub(r"<[^>]+>", "", text)).strip())
            for span, cls, text in re.findall(r'<td colspan="(\d+)"(?: class="([\w-]+)")?[^>]*>(.*?)</td>', row, re.S)
        ]
    return found


def book_links(html: str) -> list[dict[str, list[str]]]:
    """The free spans' links to the claim form, as their query."""
    hrefs = re.findall(r'class="calendar-free"><a href="([^"]+)"', html)
    return [parse_qs(urlsplit(unescape(href)).query) for href in hrefs]


def test_the_calendar_shows_each_claim_as_a_bar_with_its_owner_and_free_spans_to_book(operator_client, operator, monday):
    node = make_node("alpha", 4)
    book(node, "train <llm>", operator, TUESDAY_9, TUESDAY_17, gpus=(3,))
    book(node, "sweep", operator, TUESDAY_17, TUESDAY_17 + timedelta(hours=2), count=4)
    response = operator_client.get("/claims/nodes/alpha/calendar/", **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html, "HTMX gets the partial alone"
    assert "<llm>" not in html, "escaped"
    shown = lines(html)
    assert list(shown) == ["GPU 0", "GPU 1", "GPU 2", "GPU 3", "4 GPUs"]
    # From Monday noon: 21 hours free, the booking's 8, then the sweep fills the node for 2.
    assert shown["GPU 3"] == [(21, "calendar-free", "free"), (8, "calendar-held", "train <llm> · lab · otto"),
                              (2, "calendar-full", "full"), (14 * 24 - 31, "calendar-free", "free")]
    assert shown["GPU 0"] == [(29, "calendar-free", "free"), (2, "calendar-full", "full"), (14 * 24 - 31, "calendar-free", "free")]
    assert shown["4 GPUs"] == [(29, "", ""), (2, "calendar-held", "sweep · lab · otto"), (14 * 24 - 31, "", "")]
    assert 'title="train &lt;llm&gt; · lab · otto, from Tue 8 Dec 09:00 to Tue 8 Dec 17:00 UTC"' in html
    # Booking a free span: that GPU, its window; the span that has begun starts "now" (no start).
    gpu3 = [q for q in book_links(html) if q["devices"] == [uuid(node, 3)]]
    assert gpu3 == [
        {"devices": [uuid(node, 3)], "ends_at": ["2026-12-08T09:00:00+00:00"]},
        {"devices": [uuid(node, 3)], "starts_at": ["2026-12-08T19:00:00+00:00"], "ends_at": ["2026-12-21T12:00:00+00:00"]},
    ]
    assert 'hx-target="#claim-form"' in html


def test_a_free_span_opens_the_claim_form_filled_in(operator_client, monday):
    node = make_node("alpha", 4)
    query = {"devices": uuid(node, 2), "starts_at": "2026-12-08T09:00:00+00:00", "ends_at": "2026-12-08T17:00:00+00:00"}
    html = operator_client.get("/claims/nodes/alpha/new/", {**query, "in_panel": "1"}, **HTMX).content.decode()
    assert html.lstrip().startswith('<form id="claim-form"'), "the form alone, for the panel"
    assert 'name="starts_at" value="2026-12-08T09:00"' in html
    assert 'name="ends_at" value="2026-12-08T17:00"' in html
    assert re.search(rf'value="{uuid(node, 2)}"[^>]*checked', html)
    # An unreadable time is left out, not an error.
    html = operator_client.get("/claims/nodes/alpha/new/", {"starts_at": "next tuesday"}).content.decode()
    assert not re.search(r'name="starts_at" value=', html)


@override_settings(TIME_ZONE="Europe/Paris")
def test_times_are_the_sites_with_its_offset(operator_client, operator, monday):
    node = make_node("alpha", 1)
    book(node, "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
    html = operator_client.get("/claims/nodes/alpha/calendar/", **HTMX).content.decode()
    assert "in Europe/Paris (UTC+0100)" in html
    assert "from Tue 8 Dec 10:00 to Tue 8 Dec 18:00 CET" in html
    assert {"devices": [uuid(node, 0)], "starts_at": ["2026-12-08T18:00:00+01:00"],
            "ends_at": ["2026-12-21T13:00:00+01:00"]} in book_links(html)


def test_a_viewer_sees_the_calendar_without_links_to_book(viewer_client, operator, monday):
    node = make_node("alpha", 2)
    book(node, "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
    html = viewer_client.get("/claims/nodes/alpha/calendar/", **HTMX).content.decode()
    assert "train · lab · otto" in html
    assert book_links(html) == [] and "claims/nodes/alpha/new" not in html


def test_the_node_page_loads_its_calendar_and_the_calendar_has_a_page_of_its_own(viewer_client, monday):
    make_node("alpha", 2)
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert 'hx-get="/claims/nodes/alpha/calendar/"' in page
    assert 'href="/claims/nodes/alpha/calendar/"' in page
    whole = viewer_client.get("/claims/nodes/alpha/calendar/")
    assert whole.status_code == 200 and "<html" in whole.content.decode()
    assert "Vary" in whole and "HX-Request" in whole["Vary"]


@pytest.mark.parametrize("path", ["/claims/nodes/alpha/calendar/", "/claims/availability/", "/claims/slots/?count=1&duration_hours=1"])
def test_the_pages_need_a_login_and_a_role_that_reads(client, outsider, path):
    make_node("alpha", 2)
    assert client.get(path).status_code == 302
    client.force_login(outsider)
    assert client.get(path).status_code == 403


def test_an_unknown_node_has_no_calendar(viewer_client):
    assert viewer_client.get("/claims/nodes/nowhere/calendar/").status_code == 404


def test_the_calendar_reads_a_fixed_number_of_queries(viewer_client, operator, monday):
    small = make_node("small", 1)
    big = make_node("big", 8)
    book(small, "a", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
    for i in range(8):
        book(big, f"b{i}", operator, TUESDAY_9, TUESDAY_17, gpus=(i,))
    counts = []
    for name in ("small", "big"):
        with CaptureQueriesContext(connection) as queries:
            assert viewer_client.get(f"/claims/nodes/{name}/calendar/", **HTMX).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]


# --- the fleet's free GPUs -----------------------------------------------------------


def h100_node(name: str, gpus: int) -> Node:
    result = ingest_snapshot(snapshot(name, gpus, name="NVIDIA H100 80GB HBM3", total_mib=81559))
    assert result.outcome == "accepted", result
    return Node.objects.get(name=name)


def test_free_gpus_per_model_by_the_hour_and_by_the_day(viewer_client, operator, monday):
    node = make_node("alpha", 4)
    h100_node("beta", 2)
    book(node, "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0, 1))
    make_node("down", 8)
    Node.objects.filter(name="down").update(offline=True)
    html = viewer_client.get("/claims/availability/").content.decode()
    rows = {unescape(m): [int(n) for n in re.findall(r"<td[^>]*>(\d+)</td>", row)]
            for m, row in re.findall(r'<th scope="row">(.*?)</th>(.*?)</tr>', html, re.S)}
    assert set(rows) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    assert len(rows["NVIDIA H200"]) == 14 * 24
    # From Monday noon: Tuesday 09:00 is the 21st hour; the offline node counts for nothing.
    assert rows["NVIDIA H200"][20:30] == [4, 2, 2, 2, 2, 2, 2, 2, 2, 4]
    assert set(rows["NVIDIA H100 80GB HBM3"]) == {2}
    by_day = viewer_client.get("/claims/availability/", {"step": "day"}, **HTMX).content.decode()
    assert "<html" not in by_day
    days = re.findall(r'<th scope="row">NVIDIA H200</th>(.*?)</tr>', by_day, re.S)[0]
    assert [int(n) for n in re.findall(r"<td[^>]*>(\d+)</td>", days)][:3] == [4, 2, 4]


def test_the_fleets_free_gpus_take_a_fixed_number_of_queries(viewer_client, operator, monday, settings):
    settings.GPUFLEET_AVAILABILITY_MAX_AGE_S = 0  # computed at each view
    counts = []
    for size in (1, 6):
        for i in range(size):
            node = make_node(f"n{size}-{i}", 2)
            book(node, "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
        with CaptureQueriesContext(connection) as queries:
            assert viewer_client.get("/claims/availability/").status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]


# --- find a slot -----------------------------------------------------------------


def slot_rows(html: str) -> list[tuple[str, str, str, str]]:
    return [(unescape(node), unescape(re.sub(r"<[^>]+>", "", gpus)), start, end)
            for node, gpus, start, end in re.findall(
                r'<th scope="row"><a [^>]*>(.*?)</a></th>\s*<td data-label="GPUs">(.*?)</td>\s*'
                r'<td data-label="From"><time datetime="([^"]+)">.*?<td data-label="Until"><time datetime="([^"]+)">', html, re.S)]


def test_find_a_slot_lists_the_earliest_windows_best_first_with_book_this(operator_client, operator, monday):
    busy = make_node("busy", 2)
    book(busy, "train", operator, None, TUESDAY_9, gpus=(0, 1))
    make_node("roomy", 8)
    make_node("snug", 2)
    h100_node("other", 2)
    response = operator_client.get("/claims/slots/", {"count": "2", "model": "h200", "duration_hours": "4"}, **HTMX)
    html = response.content.decode()
    assert "<html" not in html
    now = NOW.isoformat()
    assert slot_rows(html) == [
        ("snug", "GPU 0, GPU 1", now, (NOW + timedelta(hours=4)).isoformat()),
        ("roomy", "GPU 0, GPU 1", now, (NOW + timedelta(hours=4)).isoformat()),
        ("busy", "GPU 0, GPU 1", TUESDAY_9.isoformat(), (TUESDAY_9 + timedelta(hours=4)).isoformat()),
    ]
    hrefs = [unescape(h) for h in re.findall(r'<a href="([^"]+)">Book this</a>', html)]
    assert parse_qs(urlsplit(hrefs[2]).query) == {
        "devices": [gpu_uuid("busy", 0), gpu_uuid("busy", 1)],
        "starts_at": ["2026-12-08T09:00:00+00:00"], "ends_at": ["2026-12-08T13:00:00+00:00"]}
    assert urlsplit(hrefs[2]).path == "/claims/nodes/busy/new/"
    assert "starts_at" not in parse_qs(urlsplit(hrefs[0]).query), "a slot from now starts when saved"


def test_booking_a_slot_through_its_link_is_accepted(operator_client, operator, monday):
    busy = make_node("busy", 2)
    book(busy, "train", operator, None, TUESDAY_9, gpus=(0, 1))
    html = operator_client.get("/claims/slots/", {"count": "2", "duration_hours": "4"}).content.decode()
    query = parse_qs(urlsplit(unescape(re.findall(r'<a href="([^"]+)">Book this</a>', html)[0])).query)
    form = operator_client.get("/claims/nodes/busy/new/", query).content.decode()
    starts = re.search(r'name="starts_at" value="([^"]+)"', form).group(1)
    ends = re.search(r'name="ends_at" value="([^"]+)"', form).group(1)
    saved = operator_client.post("/claims/nodes/busy/new/", {
        "name": "eval", "mode": "devices", "devices": query["devices"], "starts_at": starts, "ends_at": ends})
    assert saved.status_code == 302
    claim = Claim.objects.get(name="eval")
    assert (claim.starts_at, claim.ends_at) == (TUESDAY_9, TUESDAY_9 + timedelta(hours=4))


def test_a_viewer_finds_slots_but_has_no_book_this(viewer_client, monday):
    make_node("alpha", 2)
    html = viewer_client.get("/claims/slots/", {"count": "1", "duration_hours": "1"}).content.decode()
    assert [row[0] for row in slot_rows(html)] == ["alpha"]
    assert "Book this" not in html


@pytest.mark.parametrize("query, field", [
    ({"count": "0", "duration_hours": "1"}, "GPUs"),
    ({"count": "1", "duration_hours": "0"}, "For (hours)"),
    ({"count": "1", "duration_hours": str(31 * 24)}, "For (hours)"),
    ({"count": "1", "duration_hours": "1", "after": "soon"}, "From"),
])
def test_find_a_slot_says_what_is_wrong(viewer_client, query, field):
    html = viewer_client.get("/claims/slots/", query, **HTMX).content.decode()
    assert f"<p>{field}: " in unescape(html)


def test_nothing_fits(viewer_client, monday):
    make_node("alpha", 2)
    html = viewer_client.get("/claims/slots/", {"count": "3", "duration_hours": "1"}).content.decode()
    assert "No node that takes new claims has that many such GPUs free for that long." in html


def test_find_a_slot_takes_a_fixed_number_of_queries(viewer_client, operator, monday, settings):
    settings.GPUFLEET_AVAILABILITY_MAX_AGE_S = 0  # computed at each view
    counts = []
    for size in (1, 6):
        for i in range(size):
            node = make_node(f"n{size}-{i}", 2)
            book(node, "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
        with CaptureQueriesContext(connection) as queries:
            html = viewer_client.get("/claims/slots/", {"count": "2", "duration_hours": "30"}).content.decode()
        assert len(slot_rows(html)) == Node.objects.count()
        counts.append(len(queries))
    assert counts[0] == counts[1]


# --- kept answers -----------------------------------------------------------------


def free_h200(client, step="hour") -> list[int]:
    html = client.get("/claims/availability/", {"step": step}).content.decode()
    row = re.findall(r'<th scope="row">NVIDIA H200</th>(.*?)</tr>', html, re.S)
    return [int(n) for n in re.findall(r"<td[^>]*>(\d+)</td>", row[0])] if row else []


def slot_nodes(client, **query) -> list[str]:
    return [row[0] for row in slot_rows(client.get("/claims/slots/", {"duration_hours": "1", **query}).content.decode())]


def test_views_within_the_max_age_share_the_answers_and_say_when_they_were_computed(viewer_client, monday, settings):
    settings.GPUFLEET_AVAILABILITY_MAX_AGE_S = 30
    make_node("alpha", 2)
    assert free_h200(viewer_client)[0] == 2 and slot_nodes(viewer_client, count="1") == ["alpha"]
    make_node("beta", 2)  # ingest drops nothing: shown within the max age
    monday.shift(29)
    html = viewer_client.get("/claims/availability/").content.decode()
    as_of = timezone.localtime(NOW)
    assert f'As of <time datetime="{as_of.isoformat()}">{as_of:%H:%M:%S}</time>' in html
    assert free_h200(viewer_client)[0] == 2 and slot_nodes(viewer_client, count="1") == ["alpha"]
    assert slot_nodes(viewer_client, count="2") == ["alpha", "beta"], "another request, another answer"
    monday.shift(2)
    assert free_h200(viewer_client)[0] == 4 and slot_nodes(viewer_client, count="1") == ["alpha", "beta"]


def test_a_claim_saved_on_the_site_drops_the_kept_answers(viewer_client, operator, monday, settings,
                                                          django_capture_on_commit_callbacks):
    settings.GPUFLEET_AVAILABILITY_MAX_AGE_S = 30
    node = make_node("alpha", 2)
    assert free_h200(viewer_client)[0] == 2 and slot_nodes(viewer_client, count="2") == ["alpha"]
    with django_capture_on_commit_callbacks(execute=True):
        book(node, "train", operator, None, TUESDAY_9, gpus=(0,))
    assert free_h200(viewer_client)[0] == 1
    assert slot_nodes(viewer_client, count="2") == ["alpha"]  # from Tuesday 09:00 now
    html = viewer_client.get("/claims/slots/", {"count": "2", "duration_hours": "1"}).content.decode()
    assert slot_rows(html)[0][2] == TUESDAY_9.isoformat()


def test_the_hour_turning_computes_the_free_gpus_again(viewer_client, monday, settings):
    settings.GPUFLEET_AVAILABILITY_MAX_AGE_S = 3600
    make_node("alpha", 2)
    first = viewer_client.get("/claims/availability/").content.decode()
    monday.shift(timedelta(hours=1))
    make_node("alpha", 2)  # still reporting; ingest drops nothing
    later = viewer_client.get("/claims/availability/").content.decode()
    starts = [re.search(r'<thead>.*?<time datetime="([^"]+)"', html, re.S).group(1) for html in (first, later)]
    assert starts == [NOW.isoformat(), (NOW + timedelta(hours=1)).isoformat()]


def test_a_max_age_of_zero_keeps_nothing(viewer_client, monday, settings):
    settings.GPUFLEET_AVAILABILITY_MAX_AGE_S = 0
    make_node("alpha", 2)
    assert free_h200(viewer_client)[0] == 2 and slot_nodes(viewer_client, count="1") == ["alpha"]
    make_node("beta", 2)
    assert free_h200(viewer_client)[0] == 4 and slot_nodes(viewer_client, count="1") == ["alpha", "beta"]


# --- the fast paths answer as reading every node would --------------------------------

NAMES = ("alpha", "Beta", "beta-2", "beta_1", "beta.3", "gamma", "Zulu", "zeta", "a-1", "a1", "éclair", "omega")
MODELS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3")


def random_fleet(rng, now) -> None:
    """Nodes of 0 to 4 GPUs of two models (some vanished), some closed in each way, some
    without GPUs present or a runtime, with claims of every kind (some in each other's way,
    as a vanished GPU's return makes them) from before now to past the days shown."""
    from gpufleet.fleet.models import Device, Maintenance, Validation

    for name in rng.sample(NAMES, rng.randint(4, len(NAMES))):
        node = Node.objects.create(
            name=name, present=rng.random() > 0.1, runtime_installed=rng.random() > 0.2,
            cdi_devices=["nvidia.com/gpu=0"] if rng.random() > 0.5 else [], offline=rng.random() < 0.1,
            health="fail" if rng.random() < 0.1 else "ok",
            last_seen=now - timedelta(hours=1 if rng.random() < 0.1 else 0))
        if rng.random() < 0.1:
            Maintenance.objects.create(node=node, until=now + timedelta(days=rng.choice((-1, 1))), reason="r")
        if rng.random() < 0.05:
            Validation.objects.create(node=node)
        gpus = rng.randint(0, 4)
        for i in range(gpus):
            model = rng.randrange(2)
            Device.objects.create(node=node, index=i, uuid=f"GPU-{name}-{i}", name=MODELS[model],
                                  vram_total_mib=(143771, 81559)[model],
                                  vanished_at=now if rng.random() < 0.1 else None)
        for k in range(rng.choice((0, 0, 1, 2, 3))):
            starts_at = now + timedelta(hours=rng.randint(-30, 15 * 24), minutes=rng.choice((0, 30)))
            ends_at = None if rng.random() < 0.15 else starts_at + timedelta(hours=rng.randint(1, 80))
            kind = rng.randrange(4)
            pinned = ([str(rng.randrange(4))], [f"GPU-{name}-{rng.randrange(4)}"], [], [])[kind]
            Claim.objects.create(node=node, name=f"{name}-{k}", device_ids=pinned, starts_at=starts_at, ends_at=ends_at,
                                 count=(0, 0, rng.randint(1, 3), 0)[kind])


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_paths_answer_as_reading_every_node(seed, monday, monkeypatch):
    import random

    from gpufleet.claims import availability
    from gpufleet.claims.placement import fleet_candidates
    from tests.gpu.test_availability import straightforward_free, straightforward_slots

    rng = random.Random(seed)
    now = NOW + timedelta(minutes=17)
    monday.move_to(now)
    random_fleet(rng, now)
    for step in availability.STEPS:
        edges, counts = availability.fleet_free(step, now)
        every = fleet_candidates(Claim.objects.overlapping(max(edges[0], now), edges[-1]), now)
        assert counts == straightforward_free(list(every), edges), (seed, step)
    monkeypatch.setattr(availability, "SLOTS_SHOWN", 3)  # fewer than the nodes free at once
    for _ in range(12):
        request = gpu.availability.SlotRequest(
            after=now + timedelta(hours=rng.choice((0, 0, 5, 30))), duration=timedelta(hours=rng.choice((1, 4, 50))),
            count=rng.randint(1, 3), model=rng.choice(("", "", "h100", " H200 ")),
            min_vram_mib=rng.choice((0, 0, 100000)))
        every = fleet_candidates(Claim.objects.overlapping(request.after, None), now)
        assert availability.fleet_slots(request, now) == straightforward_slots(request, every, 3), (seed, request)
