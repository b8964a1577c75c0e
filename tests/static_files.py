"""The site's WhiteNoise middleware, with the apps' static files found once per test
process instead of once per test client: Django's test client builds its middleware
anew for each client, and WhiteNoise's walk of every app's static folder was a good
part of a test's time. Each client serves the same files, with the same headers."""

from __future__ import annotations

from whitenoise.middleware import WhiteNoiseMiddleware

# Static URL prefix -> {URL: WhiteNoise's file}, as the first client of the process found them.
FOUND: dict[str, dict] = {}


class StaticFilesFoundOnce(WhiteNoiseMiddleware):
    def add_files_from_finders(self):
        if self.static_prefix not in FOUND:
            super().add_files_from_finders()
            FOUND[self.static_prefix] = dict(self.files)
        self.files.update(FOUND[self.static_prefix])
