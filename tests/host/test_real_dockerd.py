"""EngineDocker against a real dockerd (skipped where none can run; required under CI=true)."""

from __future__ import annotations

from gpufleet.agent.adapters import EngineDocker


def test_real_dockerd_lists_nvidia_runtime_without_cdi_devices(real_dockerd):
    info = EngineDocker(real_dockerd).info()
    assert info.error == ""
    assert "nvidia" in info.runtimes
    assert "runc" in info.runtimes
    assert info.cdi_devices == ()


def test_real_dockerd_through_docker_host(real_dockerd, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", real_dockerd)
    assert "nvidia" in EngineDocker().info().runtimes
