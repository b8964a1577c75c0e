from django.contrib import admin

from gpufleet.audit.models import AuditEntry
from gpufleet.core.admin_readonly import ReadOnlyAdmin


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "username", "action", "node_name", "target"]
    list_filter = ["action"]
    search_fields = ["username", "node_name", "target"]
    readonly_fields = [f.name for f in AuditEntry._meta.fields]
