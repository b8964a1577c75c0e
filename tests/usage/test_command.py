"""`manage.py usage`: the usage report of a period as a plain aligned table (totals last,
the unknown hours stated), or with --json exactly what GET /api/usage/ answers; a bad
option refused in the API's words. The API's tests (test_api.py) hold the two equal on
a day the real ingest stored."""

from __future__ import annotations

import io
import json
from datetime import UTC
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from gpufleet.usage.management.commands.usage import Command
from tests.usage.api_helpers import DAY, known_hours

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parents[2] / "docs" / "commands.md"


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("usage", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def prices(settings):
    settings.GPUFLEET_PRICE_GPU_HOUR = {"NVIDIA H200": 4.0, "*": 1.0}
    settings.GPUFLEET_PRICE_KWH = 0.5
    settings.GPUFLEET_CURRENCY = "EUR"


def test_it_prints_an_aligned_table_with_the_totals_last_and_the_unknown_hours_stated(prices):
    known_hours()
    assert _run("--from", DAY, "--to", DAY, "--by", "owner").splitlines() == [
        "GPU-hours by owner, 2025-03-04 to 2025-03-04 (UTC)",
        "owner       reserved  used  idle reserved  used unreserved  efficiency   kWh  cost EUR",
        "otto            2.00  1.00           1.00             0.00         50%  1.40      8.70",
        "(no owner)      0.00  0.50           0.00             0.50           -     -      2.00",
        "vera            0.08  0.00           0.08             0.00          0%  0.01      0.09",
        "total           2.08  1.50           1.08             0.50         48%  1.41     10.79",
        "unknown: 2.00 GPU-hours no snapshot covered (neither used nor idle); "
        "1.00 GPU-hours seen without a power reading (not in kWh)",
    ]


def test_each_group_s_key_is_named_in_words():
    known_hours()
    claims = _run("--from", DAY, "--to", DAY, "--by", "claim").splitlines()
    assert [line.split("  ")[0] for line in claims[2:-1]] == [
        "train on alpha", "unreserved on alpha", "notebooks on beta", "unreserved on beta", "total"]
    assert claims[1].startswith("claim ") and claims[1].endswith("  cost")
    images = _run("--from", DAY, "--to", DAY, "--by", "image").splitlines()
    assert [line.split("  ")[0] for line in images[2:-1]] == ["pytorch/pytorch:2.5.1", "(no image)", "total"]
    labels = _run("--from", DAY, "--to", DAY, "--by", "label", "--owner", "otto").splitlines()
    assert [line.split("  ")[0] for line in labels[2:-1]] == ["train", "total"]
    models = _run("--from", DAY, "--to", DAY, "--by", "model").splitlines()
    assert [line.split("  ")[0] for line in models[2:-1]] == ["NVIDIA H200", "NVIDIA A100", "total"]


def test_without_usage_it_prints_the_empty_totals():
    lines = _run("--period", "month").splitlines()
    today = timezone.now().astimezone(UTC).date()
    assert lines[0] == f"GPU-hours by owner, {today.replace(day=1)} to {today} (UTC)"
    assert lines[2].split() == ["total", "0.00", "0.00", "0.00", "0.00", "-", "-", "-"]
    assert lines[3].startswith("unknown: 0.00 GPU-hours")


def test_json_is_the_api_s_answer(viewer_client, prices):
    known_hours()
    out = _run("--from", DAY, "--to", DAY, "--by", "node", "--model", "NVIDIA H200", "--json")
    api = viewer_client.get("/api/usage/", {"from": DAY, "to": DAY, "by": "node", "model": "NVIDIA H200"})
    assert json.loads(out) == api.json()


@pytest.mark.parametrize("args, words", [
    (["--by", "colour"], "by is one of owner, team, claim, image, label, node, model, not 'colour'"),
    (["--from", "4 March"], "from is a day written YYYY-MM-DD, not '4 March'"),
    (["--from", "2025-03-04", "--to", "2025-03-01"], "the period ends before it starts: to is before from"),
    (["--period", "month", "--from", "2025-03-01"], "give a period, or from and to days, not both"),
    (["--claim-id", "train"], "claim_id is a whole number, not 'train'"),
])
def test_a_bad_option_is_refused_in_the_api_s_words(args, words):
    with pytest.raises(CommandError) as refused:
        _run(*args)
    assert str(refused.value) == words


def test_the_commands_page_names_every_option():
    text = DOCS.read_text(encoding="utf-8")
    assert "python manage.py usage" in text
    missing = [option for option in [*Command.OPTIONS, "--json"] if option not in text]
    assert not missing, missing
