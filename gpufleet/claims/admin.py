from django.contrib import admin

from gpufleet.claims.models import Claim
from gpufleet.core.admin_readonly import ReadOnlyAdmin


@admin.register(Claim)
class ClaimAdmin(ReadOnlyAdmin):
    # Read-only here: claim changes, deletes too, go through the ledger (the claims editor or the
    # API), which locks the node, keeps its reserved count and writes the audit row.
    list_display = ["name", "node", "count", "device_ids", "missing_devices", "owner", "starts_at", "ends_at", "updated_at"]
    list_filter = ["starts_at", "ends_at"]
    search_fields = ["name", "node__name", "owner__username", "contact"]
    list_select_related = ["node", "owner"]
    readonly_fields = [
        "node", "name", "count", "device_ids", "missing_devices", "owner", "contact", "starts_at", "ends_at",
        "created_by", "created_at", "updated_at",
    ]
