"""Settings from the environment: bad values stop start-up naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.env import SettingError, env_bool, env_float, env_list, local_secret_key

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw, expected", [("true", True), ("1", True), ("off", False), ("", False)])
def test_booleans(monkeypatch, raw, expected):
    monkeypatch.setenv("X_FLAG", raw)
    assert env_bool("X_FLAG", not expected) is expected


def test_a_bad_boolean_names_the_variable(monkeypatch):
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(SettingError, match="X_FLAG='maybe' is not a boolean"):
        env_bool("X_FLAG", False)


def test_numbers_have_defaults_and_bounds(monkeypatch):
    assert env_float("X_MISSING", 30.0) == 30.0
    monkeypatch.setenv("X_N", "0.5")
    with pytest.raises(SettingError, match="must be at least 1"):
        env_float("X_N", 30.0, minimum=1.0)
    monkeypatch.setenv("X_N", "soon")
    with pytest.raises(SettingError, match="X_N='soon' is not a number"):
        env_float("X_N", 30.0)


def test_lists_are_comma_separated(monkeypatch):
    monkeypatch.setenv("X_LIST", " cdi, ,runtime ")
    assert env_list("X_LIST", []) == ["cdi", "runtime"]


def test_the_generated_secret_key_is_kept_and_private(tmp_path):
    path = tmp_path / "secret_key"
    key = local_secret_key(path)
    assert len(key) > 40 and local_secret_key(path) == key
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_start_up_refuses_a_bad_collect_interval(tmp_path):
    env = {**os.environ, "GPUFLEET_COLLECT_INTERVAL": "soon", "GPUFLEET_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "GPUFLEET_COLLECT_INTERVAL='soon' is not a number" in proc.stderr


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    env = {**os.environ, "GPUFLEET_PRODUCTION": "true", "GPUFLEET_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("SECRET_KEY", None)
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "SECRET_KEY must be set" in proc.stderr
