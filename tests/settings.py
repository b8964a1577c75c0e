"""Test settings: the project's own, with state kept in a scratch folder (the
SQLite file, the private Redis's socket, beat schedules), never in the checkout."""

import os
import tempfile

os.environ.setdefault("GPUFLEET_DATA_DIR", tempfile.mkdtemp(prefix="gpufleet-test-"))
# One signing key for the tests and the worker processes they start (which inherit the
# environment but may get data dirs, so secret keys, of their own).
os.environ.setdefault("GPUFLEET_SIGNING_KEY", "gpufleet-tests-" + os.environ["GPUFLEET_DATA_DIR"])

from gpufleet.settings import *  # noqa: F403

# Fast hashing for the personas' passwords; the real hasher is tested by Django.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
