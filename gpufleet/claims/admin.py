from django.contrib import admin

from gpufleet.claims.models import Claim


@admin.register(Claim)
class ClaimAdmin(admin.ModelAdmin):
    # Read-only here: claim changes must go through the ledger (the claims editor or the API).
    list_display = ["name", "node", "count", "device_ids", "missing_devices", "owner", "expires_at", "updated_at"]
    list_filter = ["expires_at"]
    search_fields = ["name", "node__name", "owner__username", "contact"]
    list_select_related = ["node", "owner"]
    readonly_fields = [
        "node", "name", "count", "device_ids", "missing_devices", "owner", "contact", "expires_at",
        "created_by", "created_at", "updated_at",
    ]

    def has_add_permission(self, request):
        return False
