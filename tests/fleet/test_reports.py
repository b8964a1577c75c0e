"""Doctor reports: /nodes/<name>/report.{json,csv,md} and /report.{json,csv,md}."""

import csv
import io
import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gpufleet.core.downloads import safe_cell
from gpufleet.fleet import reports
from gpufleet.fleet.models import Device, Finding, Node
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import ingest, snapshot
from tests.fleet.test_commands import DEVICE_KEYS as DOCTOR_DEVICE_KEYS

DOCTOR_KEYS = {
    "node", "present", "driver_version", "devices", "runtime_installed", "toolkit_version",
    "cdi_spec_files", "cdi_devices", "attach", "findings",
}
# The doctor's device keys: the report exports what `doctor --json` writes.
DEVICE_KEYS = set(DOCTOR_DEVICE_KEYS)


def _body(response) -> str:
    assert response.streaming
    return b"".join(response.streaming_content).decode()


@pytest.mark.django_db
def test_it_exports_a_node_as_json(viewer_client, alpha):
    response = viewer_client.get(reverse("fleet:node_report", args=["alpha", "json"]))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith('attachment; filename="gpufleet-alpha-doctor-')
    report = json.loads(_body(response))
    assert DOCTOR_KEYS | {"schema_version", "collected_at", "status"} <= set(report)
    assert report["schema_version"] == 1 and report["status"] == "ok" and report["node"] == "alpha"
    assert len(report["devices"]) == 8 and set(report["devices"][0]) == DEVICE_KEYS
    cdi = next(f for f in report["findings"] if f["code"] == "cdi")
    assert set(cdi) == {"code", "name", "status", "message", "fix"}
    driver = next(f for f in report["findings"] if f["code"] == "driver")
    assert "fix" not in driver  # fix only when there is one, as the doctor writes it


@pytest.mark.django_db
def test_it_keeps_only_problems(viewer_client):
    ingest("alpha", 2, used_mib=140000, toolkit=None)
    report = json.loads(_body(viewer_client.get("/nodes/alpha/report.json?only=problems")))
    assert report["findings"] and {f["status"] for f in report["findings"]} <= {"warn", "fail"}
    assert {"gpu0", "gpu1", "toolkit"} <= {f["code"] for f in report["findings"]}


@pytest.mark.django_db
def test_it_says_offline_in_the_report(viewer_client, alpha):
    Node.objects.filter(pk=alpha.pk).update(offline=True)
    assert json.loads(_body(viewer_client.get("/nodes/alpha/report.json")))["status"] == "offline"


@pytest.mark.django_db
def test_it_exports_csv_one_row_per_finding_guarded(viewer_client, alpha):
    Finding.objects.filter(node=alpha, code="driver").update(message="=HYPERLINK(\"http://evil\")", name="+sum")
    Finding.objects.filter(node=alpha, code="attach").update(message="@cmd", fix="-2+3")
    response = viewer_client.get("/nodes/alpha/report.csv")
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(_body(response))))
    assert rows[0][:7] == ["node", "code", "name", "status", "message", "fix", "row"]
    assert sum(row[6] == "finding" for row in rows[1:]) == alpha.findings.count()
    assert sum(row[6] == "device" for row in rows[1:]) == 8
    by_code = {row[1]: row for row in rows[1:]}
    assert by_code["driver"][2] == "'+sum" and by_code["driver"][4] == "'=HYPERLINK(\"http://evil\")"
    assert by_code["attach"][4] == "'@cmd" and by_code["attach"][5] == "'-2+3"
    assert by_code["cdi"][5] == "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def test_it_guards_every_formula_prefix():
    for prefix in "=+-@\t\r":
        assert safe_cell(prefix + "x") == "'" + prefix + "x"
    assert safe_cell("plain") == "plain" and safe_cell(None) == "" and safe_cell(3) == "3"


@pytest.mark.django_db
def test_it_exports_markdown_ready_for_a_ticket(viewer_client):
    ingest("alpha", 2, used_mib=140000)
    Finding.objects.filter(node__name="alpha", code="driver").update(
        message="a | b <img src=x>", fix="echo ``<img src=x onerror=alert(1)>``")
    response = viewer_client.get("/nodes/alpha/report.md")
    text = _body(response)
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert text.startswith("# gpufleet doctor report\n")
    assert "## alpha: Warning" in text
    assert "attach: nvidia runtime" in text  # as the pages name the mode, not "legacy"
    assert "| Status | Check | Message | Fix |" in text
    assert "| WARN | GPU 0 \\(NVIDIA H200\\) |" in text
    # Text escaped, and a fix in a code span fenced longer than any backtick run in it.
    assert "| a \\| b &lt;img src\\=x&gt; | ``` echo ``<img src=x onerror=alert(1)>`` ``` |" in text
    assert "` sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml `" in text
    # Worst first.
    assert text.index("| WARN |") < text.index("| OK |")


@pytest.mark.django_db
def test_it_404s_unknown_node_and_format(viewer_client, alpha):
    assert viewer_client.get("/nodes/nope/report.json").status_code == 404
    assert viewer_client.get("/nodes/alpha/report.xml").status_code == 404


@pytest.mark.django_db
def test_it_exports_the_fleet_as_json_with_the_overview_filters(viewer_client):
    ingest("alpha", 2)
    ingest("bravo", 2, attach="cdi")
    ingest("charlie", 0, attach="none", toolkit=None)
    data = json.loads(_body(viewer_client.get("/report.json?sort=-name")))
    assert data["schema_version"] == 1 and "generated_at" in data
    assert [n["node"] for n in data["nodes"]] == ["charlie", "bravo", "alpha"]
    assert all(DOCTOR_KEYS | {"schema_version", "collected_at", "status"} <= set(n) for n in data["nodes"])

    filtered = json.loads(_body(viewer_client.get("/report.json?attach=cdi")))
    assert [n["node"] for n in filtered["nodes"]] == ["bravo"]
    empty = json.loads(_body(viewer_client.get("/report.json?q=zzz")))
    assert empty["nodes"] == []


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["json", "csv", "md"])
def test_it_refuses_a_fleet_export_with_an_invalid_filter(viewer_client, make_fleet, fmt):
    make_fleet(2)
    response = viewer_client.get(f"/report.{fmt}?attach=legacy&health=bogus&sort=-nope")
    assert response.status_code == 400
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert "Content-Disposition" not in response
    assert response.content.decode().splitlines() == [
        "No report: these filter values are not valid.",
        "health: Select a valid choice. bogus is not one of the available choices.",
        "sort: Select a valid choice. -nope is not one of the available choices.",
    ]


@pytest.mark.django_db
def test_it_exports_a_bookmarked_driver_that_left_the_fleet_as_empty(viewer_client, make_fleet):
    make_fleet(2)
    response = viewer_client.get("/report.json?driver=535.0")
    assert response.status_code == 200
    assert json.loads(_body(response))["nodes"] == []


@pytest.mark.django_db
def test_it_leaves_healthy_nodes_out_of_fleet_problem_reports(viewer_client):
    ingest("alpha", 2)
    ingest("bravo", 2, used_mib=140000)
    offline = ingest("charlie", 2)
    Node.objects.filter(pk=offline.pk).update(offline=True)
    data = json.loads(_body(viewer_client.get("/report.json?only=problems")))
    assert [n["node"] for n in data["nodes"]] == ["charlie", "bravo"]  # as the overview lists them: worst first
    assert all(f["status"] in ("warn", "fail") for n in data["nodes"] for f in n["findings"])


@pytest.mark.django_db
def test_it_exports_the_fleet_as_csv_and_markdown(viewer_client, make_fleet):
    make_fleet(3)
    rows = list(csv.reader(io.StringIO(_body(viewer_client.get("/report.csv")))))
    assert rows[0][:6] == ["node", "code", "name", "status", "message", "fix"]
    assert {row[0] for row in rows[1:]} == {"node-00", "node-01", "node-02"}
    text = _body(viewer_client.get("/report.md?only=problems"))
    assert text.startswith("# gpufleet doctor report (warnings and failures only)")
    assert "No nodes to report." in text
    assert "## node\\-01: OK" in _body(viewer_client.get("/report.md"))  # punctuation escaped


@pytest.mark.django_db
def test_it_links_downloads_with_the_current_filters(viewer_client, alpha):
    page = viewer_client.get("/?attach=legacy&page=1").content.decode()
    assert 'href="/report.json?attach=legacy"' in page
    assert 'href="/report.md?attach=legacy&amp;only=problems"' in page
    node_page = viewer_client.get("/nodes/alpha/").content.decode()
    assert 'href="/nodes/alpha/report.csv?only=problems"' in node_page


# session, user, permissions (user, groups), then one chunk of nodes with its
# current devices and findings prefetched.
FLEET_EXPORT_QUERIES = 7


@pytest.mark.django_db
@pytest.mark.parametrize("size", [3, 30])
@pytest.mark.parametrize("fmt", ["json", "csv", "md"])
def test_it_streams_the_fleet_in_fixed_queries(viewer_client, make_fleet, django_assert_num_queries, size, fmt):
    make_fleet(size)
    with django_assert_num_queries(FLEET_EXPORT_QUERIES):
        body = _body(viewer_client.get(f"/report.{fmt}"))
    shown = reports.md_cell if fmt == "md" else str
    assert shown("node-00") in body and shown(f"node-{size - 1:02d}") in body


@pytest.mark.django_db
def test_it_reads_a_node_report_in_fixed_queries(viewer_client, alpha, django_assert_num_queries):
    with django_assert_num_queries(7):  # session, user, permissions (2), node, devices, findings
        _body(viewer_client.get("/nodes/alpha/report.json"))



@pytest.mark.django_db
def test_the_csv_has_a_row_per_gpu_with_its_health(viewer_client):
    snap = snapshot("alpha", 2)
    snap["devices"][1].update(temperature_c=92, power_draw_w=612.5, throttle_reasons=["hw_thermal_slowdown"],
                              xid_errors=[{"xid": 79, "count": 2, "last_seen": None, "description": "fell off"}])
    ingest_snapshot(snap)
    rows = list(csv.DictReader(io.StringIO(_body(viewer_client.get("/nodes/alpha/report.csv")))))
    gpu1 = next(r for r in rows if r["row"] == "device" and r["index"] == "1")
    assert (gpu1["code"], gpu1["temperature_c"], gpu1["power_draw_w"]) == ("gpu1", "92", "612.5")
    assert gpu1["throttle_reasons"] == "hw_thermal_slowdown" and gpu1["xid_errors"] == "79x2"
    problems = list(csv.DictReader(io.StringIO(_body(viewer_client.get("/nodes/alpha/report.csv?only=problems")))))
    assert not [r for r in problems if r["row"] == "device"]


def _mig_node() -> None:
    snap = snapshot("alpha", 2)
    snap["devices"][0].update(ecc_mode=True, persistence_mode=False, remapped_rows_correctable=3,
                              remapped_rows_pending=True, remapped_rows_failure=False, mig_mode=True,
                              mig_devices=[{"uuid": "MIG-aaaa", "profile": "3g.40gb", "device": 0},
                                           {"uuid": "MIG-bbbb", "profile": "1g.10gb", "device": 1}])
    # Column-stored figures too, so a report that lost one of them would differ.
    for i, device in enumerate(snap["devices"]):
        device.update(pci_bus_id=f"00000000:{0x18 + i:02X}:00.0", temperature_c=40 + i, power_draw_w=300.5 + i)
    assert ingest_snapshot(snap).outcome == "accepted"


@pytest.mark.django_db
def test_the_csv_device_rows_carry_ecc_remapping_persistence_and_mig(viewer_client):
    _mig_node()
    rows = list(csv.DictReader(io.StringIO(_body(viewer_client.get("/nodes/alpha/report.csv")))))
    gpu0, gpu1 = (r for r in rows if r["row"] == "device")
    assert (gpu0["ecc_mode"], gpu0["persistence_mode"], gpu0["mig_mode"]) == ("true", "false", "true")
    assert (gpu0["remapped_rows_correctable"], gpu0["remapped_rows_pending"], gpu0["remapped_rows_failure"]) == (
        "3", "true", "false")
    assert gpu0["mig_devices"] == "3g.40gb:MIG-aaaa 1g.10gb:MIG-bbbb"
    assert gpu1["mig_devices"] == "" and gpu1["ecc_mode"] == ""  # unknown stays empty


@pytest.mark.django_db
def test_the_csv_read_from_rows_says_what_the_node_s_report_says(viewer_client):
    """The CSV is written from plain column values, the JSON from the domain's report:
    both must say the same of every GPU and finding."""
    _mig_node()
    report = json.loads(_body(viewer_client.get("/nodes/alpha/report.json")))
    rows = list(csv.reader(io.StringIO(_body(viewer_client.get("/nodes/alpha/report.csv")))))[1:]
    findings = [r[:6] for r in rows if r[6] == "finding"]
    assert findings == [["alpha", f["code"], f["name"], f["status"], f["message"], f.get("fix", "")]
                        for f in report["findings"]]
    expected = [reports._device_row("alpha", d) for d in report["devices"]]
    buffer = io.StringIO()
    csv.writer(buffer).writerows(expected)
    assert [r for r in rows if r[6] == "device"] == list(csv.reader(io.StringIO(buffer.getvalue())))
    assert len(expected) == 2


@pytest.mark.django_db
@pytest.mark.postgresql
def test_the_bench_s_copy_floor_exports_the_same_rows_as_the_fleet_csv(viewer_client):
    """The fleet CSV's floor in `manage.py bench` is only a fair peer if it writes what the CSV writes."""
    from django.db import connection

    from gpufleet.tools.floors import report_csv_copy
    _mig_node()
    ingest("beta", 1)
    ours = list(csv.reader(io.StringIO(_body(viewer_client.get("/report.csv")))))
    with connection.cursor() as cursor, cursor.connection.cursor() as raw, raw.copy(report_csv_copy()) as copy:
        floor = list(csv.reader(io.StringIO(b"".join(bytes(data) for data in copy).decode())))
    assert len(ours) > 3 and ours == floor


def _fleet_with_an_older_agent_and_an_offline_node() -> None:
    ingest("alpha", 2)
    ingest("bravo", 2, used_mib=140000, toolkit=None)
    ingest("charlie", 0, attach="none", toolkit=None)
    older = ingest("delta", 2)
    # Rows an older agent left: only the fields it knew, records without their later keys.
    Device.objects.filter(node=older, index=0).update(health={})
    Device.objects.filter(node=older, index=1).update(
        health={"processes": [{"pid": 7, "name": "python3"}], "throttle_reasons": None})
    Node.objects.filter(name="charlie").update(offline=True)


@pytest.mark.django_db
def test_the_fleet_json_says_of_each_node_what_its_own_report_says(viewer_client):
    """The fleet's GPUs are read without a domain Device each (gpu.device_dict), a node's
    report through one: an older agent's GPU must come out the same in both."""
    _fleet_with_an_older_agent_and_an_offline_node()
    fleet = _body(viewer_client.get("/report.json")).splitlines()[1:-1]
    assert len(fleet) == 4
    for line in fleet:
        name = json.loads(line.rstrip(","))["node"]
        own = json.dumps(json.loads(_body(viewer_client.get(f"/nodes/{name}/report.json"))))
        assert line.rstrip(",") == own


@pytest.mark.django_db
@pytest.mark.parametrize("only_problems", [False, True])
def test_the_fleet_markdown_reads_no_gpu_s_figures_to_print_its_count(only_problems):
    _fleet_with_an_older_agent_and_an_offline_node()
    nodes = Node.objects.order_by("name")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    full = "".join(reports.fleet_markdown(list(reports.fleet_reports(nodes, only_problems)), at, only_problems))
    with CaptureQueriesContext(connection) as queries:
        cheap = "".join(reports.fleet_markdown(reports.fleet_reports(nodes, only_problems), at, only_problems))
    assert cheap == full and "GPUs: 2" in cheap
    assert not [q["sql"] for q in queries.captured_queries if '"fleet_device"."health"' in q["sql"]]
