from django.contrib import admin

from gpufleet.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["at", "username", "action", "node_name", "target"]
    list_filter = ["action"]
    search_fields = ["username", "node_name", "target"]
    readonly_fields = [f.name for f in AuditEntry._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
