"""The hourly usage rows in the admin site, shown and never changed: ingest and the
central beat write them, and a row changed here would make every report after it
wrong without a trace."""

from __future__ import annotations

from django.contrib import admin

from gpufleet.core.admin_readonly import ReadOnlyAdmin
from gpufleet.usage.models import UsageHour


@admin.register(UsageHour)
class UsageHourAdmin(ReadOnlyAdmin):
    list_display = ["bucket", "node", "claim", "owner", "team", "model", "image", "label", "seen_s", "used_s", "energy_wh",
                    "unknown_s"]
