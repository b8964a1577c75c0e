from django.contrib import admin

from gpufleet.core.admin_readonly import ReadOnlyAdmin
from gpufleet.jobs.models import Job


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ["id", "node", "kind", "fix_code", "status", "created_at", "finished_at"]
    list_filter = ["kind", "status"]
    list_select_related = ["node"]
    readonly_fields = [f.name for f in Job._meta.fields]
