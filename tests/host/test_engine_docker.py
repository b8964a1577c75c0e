"""EngineDocker against the fake Docker Engine API."""

from __future__ import annotations

import pytest

from gpufleet.agent.adapters import (
    DEFAULT_DOCKER_HOST,
    DockerInfo,
    EngineDocker,
    UnixHTTPConnection,
    docker_info_from_payload,
    engine_connection,
)
from tests.fakes import DOCKER_PAYLOADS, FakeDockerEngine, docker_payload, unix_http_get

CDI_IDS = (
    "nvidia.com/gpu=0",
    "nvidia.com/gpu=GPU-0008bcf4-cae8-0120-a18f-bc344fb1c710",
    "nvidia.com/gpu=all",
)


@pytest.fixture
def engine():
    with FakeDockerEngine(docker_payload("nvidia-cdi")) as eng:
        yield eng


def test_runtimes_and_cdi_devices(engine):
    info = EngineDocker(engine.url).info()
    assert info == DockerInfo(
        runtimes=("io.containerd.runc.v2", "nvidia", "runc"), cdi_devices=CDI_IDS
    )
    assert info.error == ""


def test_exactly_one_info_request_per_call(engine):
    docker = EngineDocker(engine.url)
    docker.info()
    assert engine.info_requests == 1
    docker.info()
    docker.info()
    assert engine.info_requests == 3
    # No version negotiation first: unversioned paths get the daemon's current API.
    assert [path for _, path in engine.log] == ["/info"] * 3


def test_cdi_devices_keep_only_nvidia_cdi_entries(engine):
    payload = docker_payload("nvidia-cdi")
    payload["DiscoveredDevices"] = [
        {"Source": "cdi", "ID": "nvidia.com/gpu=1"},
        {"Source": "cdi", "ID": "amd.com/gpu=0"},
        {"Source": "cdi", "ID": "nvidia.com/mig=0:1"},
        {"Source": "something-else", "ID": "nvidia.com/gpu=2"},
        {"Source": "cdi", "ID": "nvidia.com/gpu=1"},
        {"Source": "cdi"},
        "garbage",
    ]
    engine.info = payload
    assert EngineDocker(engine.url).info().cdi_devices == ("nvidia.com/gpu=1",)


def test_discovered_devices_absent(engine):
    engine.info = docker_payload("no-nvidia")
    info = EngineDocker(engine.url).info()
    assert "DiscoveredDevices" not in engine.info
    assert info == DockerInfo(
        runtimes=("io.containerd.runc.v2", "runc"), cdi_devices=()
    )


@pytest.mark.parametrize("kind", DOCKER_PAYLOADS)
def test_every_recorded_payload_reads_without_error(engine, kind):
    engine.info = docker_payload(kind)
    info = EngineDocker(engine.url).info()
    assert info.error == ""
    assert ("nvidia" in info.runtimes) == (
        kind in ("nvidia-cdi", "nvidia-runtime", "nvidia-cdi-empty")
    )
    assert bool(info.cdi_devices) == (kind in ("nvidia-cdi", "cdi-only"))


def test_unreachable_socket_is_an_error_not_an_exception(tmp_path):
    url = f"unix://{tmp_path / 'none.sock'}"
    info = EngineDocker(url, timeout=1).info()
    assert info.runtimes == () and info.cdi_devices == ()
    assert info.error.startswith(f"Docker at {url} is unreachable: ")
    assert "no socket" in info.error


def test_refused_connection(tmp_path):
    import socket

    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays; nobody listens
    info = EngineDocker(f"unix://{path}", timeout=1).info()
    assert "unreachable" in info.error and "refused" in info.error


def test_slow_info_beyond_timeout_is_an_error(engine):
    engine.delay = 3.0
    info = EngineDocker(engine.url, timeout=0.5).info()
    assert info.runtimes == ()  # a client that waited for the answer would have its runtimes
    assert (
        info.error == f"Docker at {engine.url} is unreachable: no answer within 0.5 s"
    )
    assert engine.info_requests == 1


def test_slow_info_within_timeout_is_fine(engine):
    engine.delay = 0.2
    assert "nvidia" in EngineDocker(engine.url, timeout=3).info().runtimes


def test_http_500(engine):
    engine.status = 500
    engine.error_message = "daemon is shutting down"
    info = EngineDocker(engine.url).info()
    assert info.runtimes == ()
    assert info.error.startswith(f"Docker at {engine.url} is unreachable: HTTP 500")
    assert "daemon is shutting down" in info.error


@pytest.mark.parametrize(
    "body", [b"\x00<html>not json", b"", b"[1, 2]", b'{"Runtimes": [1]}']
)
def test_garbage_body(engine, body):
    engine.body = body
    info = EngineDocker(engine.url).info()
    assert info.runtimes == () and info.cdi_devices == ()
    assert info.error.startswith(f"Docker at {engine.url} is unreachable: ")
    assert len(info.error) < 300


def test_docker_host_env_and_default(engine, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", engine.url)
    docker = EngineDocker()  # resolved at each call
    assert docker.url == engine.url
    assert "nvidia" in docker.info().runtimes
    monkeypatch.delenv("DOCKER_HOST")
    assert docker.url == DEFAULT_DOCKER_HOST == "unix:///var/run/docker.sock"
    assert EngineDocker("unix:///x.sock").url == "unix:///x.sock"


def test_unsupported_scheme_is_an_error():
    info = EngineDocker("bogus://nowhere", timeout=1).info()
    assert info.error.startswith("Docker at bogus://nowhere is unreachable: ")


def test_each_connection_is_closed(engine, tmp_path, monkeypatch):
    opened, closed = [], []
    connect, close = UnixHTTPConnection.connect, UnixHTTPConnection.close
    monkeypatch.setattr(UnixHTTPConnection, "connect", lambda self: opened.append(1) or connect(self))
    monkeypatch.setattr(UnixHTTPConnection, "close", lambda self: closed.append(1) or close(self))
    docker = EngineDocker(engine.url)
    docker.info()
    docker.containers()
    docker.inspect(["nope"])
    engine.status = 500
    docker.info()
    EngineDocker(f"unix://{tmp_path / 'none.sock'}", timeout=1).info()
    assert len(opened) == 5 and len(closed) >= 5


def test_tcp_and_unsupported_urls():
    assert (engine_connection("tcp://10.0.0.5:2375", 1).host, engine_connection("tcp://h", 1).port) == ("10.0.0.5", 2375)
    assert "unsupported DOCKER_HOST" in EngineDocker("ssh://me@host", timeout=1).info().error


def test_payload_reader_rejects_non_objects():
    with pytest.raises(TypeError):
        docker_info_from_payload(["Runtimes"])
    assert docker_info_from_payload({"Runtimes": None}) == DockerInfo()


def test_fake_engine_basics(tmp_path):
    with FakeDockerEngine({"Runtimes": {}}, socket_path=tmp_path / "d.sock") as eng:
        assert eng.url == f"unix://{tmp_path / 'd.sock'}"
        assert unix_http_get(eng.socket_path, "/_ping") == (200, b"OK")
        status, body = unix_http_get(eng.socket_path, "/version")
        assert (
            status == 200
            and b'"ApiVersion": "1.47"' in body
            and b'"MinAPIVersion": "1.24"' in body
        )
        assert unix_http_get(eng.socket_path, "/v1.44/info") == (
            200,
            b'{"Runtimes": {}}',
        )
        assert unix_http_get(eng.socket_path, "/nope")[0] == 404
        assert eng.info_requests == 1 and eng.requests["/v1.44/info"] == 1
    assert not (tmp_path / "d.sock").exists()
