"""The migrations: one per app for 0.1.0, each standing on its own (no gpufleet import: a
migration must make the same schema whatever the application's code becomes), and none
missing for the models as they are. A schema change after 0.1.0 ships as a new migration
after these (docs/install-and-upgrade.md) and is added to SHIPPED."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.core.management import call_command

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {app: ["0001_initial"] for app in ("alerts", "api", "audit", "claims", "events", "fleet", "jobs")}
SHIPPED["events"].append("0002_muted_and_site_events")
SHIPPED["claims"].append("0002_claim_name_trigram")
SHIPPED["usage"] = ["0001_initial"]
SHIPPED["claims"].append("0003_claim_idle_warned_at")
SHIPPED["events"].append("0003_claim_idle_and_usage_report_kinds")
SHIPPED["usage"] += ["0002_monthly_report", "0003_usage_group_statistics"]
SHIPPED["fleet"] += ["0002_finding_problems", "0003_node_search_trigram", "0004_node_rollups", "0005_finding_use"]
SHIPPED["fleet"].append("0006_node_gpus_busy_unclaimed")
SHIPPED["fleet"].append("0007_dcgm_and_validation")
SHIPPED["jobs"].append("0002_dcgm_diagnostic")
SHIPPED["events"].append("0004_dcgm_diagnostic_kind")
SHIPPED["sso"] = ["0001_initial", "0002_identity_refresh_token"]
SHIPPED["events"].append("0005_ingest_dead_letter_kind")
SHIPPED["alerts"].append("0002_delivery_muted")
SHIPPED["claims"].append("0004_claim_windows")
SHIPPED["claims"].append("0005_claim_series")
SHIPPED["alerts"].append("0003_channel_format")
SHIPPED["teams"] = ["0001_initial"]
SHIPPED["claims"].append("0006_claim_team")
SHIPPED["claims"].append("0007_claim_reminders")
SHIPPED["usage"].append("0004_usage_team")
SHIPPED["api"].append("0002_calendar_feed")
SHIPPED["teams"].append("0002_team_quotas")
SHIPPED["claims"].append("0008_claim_quota_override_reason")


def _migrations() -> dict[str, list[Path]]:
    return {
        folder.parent.name: sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        for folder in sorted((REPO / "gpufleet").glob("*/migrations"))
    }


def test_each_app_has_the_migrations_shipped():
    assert {app: [p.stem for p in files] for app, files in _migrations().items()} == SHIPPED


@pytest.mark.parametrize("path", [p for files in _migrations().values() for p in files], ids=lambda p: str(p.relative_to(REPO)))
def test_no_migration_imports_application_code(path):
    imported = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    assert [name for name in imported if name.split(".")[0] in ("gpufleet", "")] == []


@pytest.mark.django_db
def test_the_models_need_no_new_migration():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_a_database_of_0_1_0_migrates_to_now_keeping_its_events():
    # An upgrade from the release: back to 0.1.0's schema, a row made there, then forward.
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    released = [(app, "0001_initial") for app in ("events", "fleet")]
    executor = MigrationExecutor(connection)
    executor.migrate(released)
    executor.loader.build_graph()
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO events_event (kind, severity, gpu_index, pci_bus_id, code, name, message_opened, "
                       "message, first_seen_at, opened_at, last_seen_at, count, claim_name) VALUES ('ingest-silent', "
                       "'fail', NULL, '', '', '', 'm', 'm', '2026-12-01T00:00:00Z', '2026-12-01T00:00:00Z', "
                       "'2026-12-01T00:00:00Z', 1, '')")
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    from gpufleet.events.models import Event

    assert list(Event.objects.values_list("kind", "muted")) == [("ingest-silent", "")]
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_rollups_kept_per_gpu_survive_the_upgrade_to_one_row_per_node(viewer_client):
    # A five-minute rollup of one GPU as fleet 0003 kept them (a row per GPU), then forward:
    # the node page's 24 h chart still shows it; and back again, the row comes back.
    from datetime import timedelta

    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    from tests.factories import ingest

    # Ingested first: ingest writes today's node columns, which 0003 lacks.
    node = ingest("alpha", 2)
    executor = MigrationExecutor(connection)
    executor.migrate([("fleet", "0003_node_search_trigram")])
    gpu = node.devices.get(index=0)
    bucket = (timezone.now() - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fleet_devicesample5m (device_id, bucket, samples, vram_used_mib_min, vram_used_mib_avg,"
                       " vram_used_mib_max, utilization_percent_min, utilization_percent_avg, utilization_percent_max,"
                       " temperature_c_min, temperature_c_avg, temperature_c_max, power_draw_w_min, power_draw_w_avg,"
                       " power_draw_w_max) VALUES (%s, %s, 10, 1000, 1500.5, 2000, 5, 40.5, 77, NULL, NULL, NULL,"
                       " 100.0, 200.25, 300.0)", [gpu.pk, bucket])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    page = viewer_client.get("/nodes/alpha/", {"range": "24h"}).content.decode()
    assert "GPU 0, 24h, 11 samples" in page  # the rollup's 10 and the sample ingested now
    assert "util. peak 77 %" in page and "power peak 300 W" in page

    executor = MigrationExecutor(connection)
    executor.migrate([("fleet", "0003_node_search_trigram")])
    with connection.cursor() as cursor:
        cursor.execute("SELECT device_id, samples, vram_used_mib_avg, utilization_percent_max, temperature_c_avg,"
                       " power_draw_w_avg FROM fleet_devicesample5m")
        assert cursor.fetchall() == [(gpu.pk, 10, 1500.5, 77, None, 200.25)]
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_claims_from_before_windows_start_when_they_were_made_and_end_at_their_expiry():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from tests.factories import ingest

    node = ingest("alpha", 2)
    executor = MigrationExecutor(connection)
    executor.migrate([("claims", "0003_claim_idle_warned_at")])
    with connection.cursor() as cursor:
        for name, expires in (("train", "'2026-12-09T17:00:00Z'"), ("forever", "NULL")):
            cursor.execute("INSERT INTO claims_claim (node_id, name, count, device_ids, missing_devices, created_at,"
                           " updated_at, contact, expires_at) VALUES (%s, %s, 1, '[]', '[]', '2026-12-01T08:30:00Z',"
                           f" '2026-12-01T08:30:00Z', '', {expires})", [node.pk, name])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    from gpufleet.claims.models import Claim

    made = "2026-12-01T08:30:00+00:00"
    assert {c.name: (c.starts_at.isoformat(), c.ends_at and c.ends_at.isoformat()) for c in Claim.objects.all()} == {
        "train": (made, "2026-12-09T17:00:00+00:00"), "forever": (made, None)}


@pytest.mark.django_db(transaction=True)
def test_claims_from_before_teams_go_to_a_general_team_of_the_people_who_made_or_own_them(django_user_model):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from tests.factories import ingest

    node = ingest("alpha", 2)
    maker, owner, bystander = (django_user_model.objects.create_user(name) for name in ("maker", "owner", "bystander"))
    executor = MigrationExecutor(connection)
    executor.migrate([("claims", "0005_claim_series"), ("teams", "0001_initial")])
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO claims_claim (node_id, name, count, device_ids, missing_devices, created_at,"
                       " updated_at, contact, starts_at, created_by_id, owner_id) VALUES (%s, 'train', 1, '[]',"
                       " '[]', '2026-12-01T08:30:00Z', '2026-12-01T08:30:00Z', '', '2026-12-01T08:30:00Z', %s, %s)",
                       [node.pk, maker.pk, owner.pk])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    from gpufleet.claims.models import Claim

    claim = Claim.objects.get()
    assert claim.team.name == "general"
    assert sorted(claim.team.members.values_list("username", flat=True)) == ["maker", "owner"]
    assert bystander.teams.count() == 0
