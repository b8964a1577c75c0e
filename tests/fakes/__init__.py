"""Fakes of a GPU host that are real enough: executables, a Docker Engine API, CDI specs."""

from .docker_engine import FakeDockerEngine, unix_http_get
from .recorded import DOCKER_PAYLOADS, docker_payload

__all__ = ["DOCKER_PAYLOADS", "FakeDockerEngine", "docker_payload", "unix_http_get"]
