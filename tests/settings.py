"""Test settings: the project's own, with state kept in a scratch folder (the
SQLite file, the private Redis's socket, beat schedules), never in the checkout."""

import os
import tempfile

os.environ.setdefault("GPUFLEET_DATA_DIR", tempfile.mkdtemp(prefix="gpufleet-test-"))
if (worker := os.environ.get("PYTEST_XDIST_WORKER")) and os.environ.get("GPUFLEET_TEST_WORKER") != worker:
    # Each pytest-xdist worker a scratch folder of its own, not the one it inherits from the
    # controller: Prometheus' multiprocess files live there, and a snapshot stored by one
    # worker's processes must not count in the other's metrics. Once per worker: the
    # processes its tests start keep the folder their test gives them.
    os.environ["GPUFLEET_TEST_WORKER"] = worker
    os.environ["GPUFLEET_DATA_DIR"] = tempfile.mkdtemp(prefix=f"gpufleet-test-{worker}-")
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
# One signing key for the tests and the worker processes they start (which inherit the
# environment but may get data dirs, so secret keys, of their own).
os.environ.setdefault("GPUFLEET_SIGNING_KEY", "gpufleet-tests-" + os.environ["GPUFLEET_DATA_DIR"])

from gpufleet.settings import *  # noqa: F403

# The alert receivers the tests send to are on loopback (tests/receivers.py);
# tests/alerts/test_destinations.py turns this off.
GPUFLEET_ALERT_ALLOW_PRIVATE = True

# Fast hashing for the personas' passwords; the real hasher is tested by Django.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# WhiteNoise as the site runs it, its finders' walk done once per process, not per test client.
MIDDLEWARE = [("tests.static_files.StaticFilesFoundOnce" if name == "whitenoise.middleware.WhiteNoiseMiddleware" else name)
              for name in MIDDLEWARE]  # noqa: F405
