from django.contrib import admin

from gpufleet.claims.models import Claim


@admin.register(Claim)
class ClaimAdmin(admin.ModelAdmin):
    # Read-only here: claim changes must go through the ledger (the claims editor or the API).
    list_display = ["name", "node", "count", "device_ids", "missing_devices", "updated_at"]
    search_fields = ["name", "node__name"]
    list_select_related = ["node"]
    readonly_fields = ["node", "name", "count", "device_ids", "missing_devices", "created_by", "created_at", "updated_at"]

    def has_add_permission(self, request):
        return False
