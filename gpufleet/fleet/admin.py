from django.contrib import admin

from gpufleet.core.admin_readonly import ReadOnlyAdmin, ReadOnlyTabularInline
from gpufleet.fleet.models import (
    Device,
    DeviceSample,
    Finding,
    Node,
    NodeCredential,
    NodeRollup1h,
    NodeRollup5m,
    XidAcknowledgement,
)
from gpufleet.fleet.vanished import forget_vanished

# Everything here is written by ingest, the housekeeping or a service (enroll, Xid
# acknowledgement): gpufleet/core/admin_readonly.py says why the admin only shows it.


class DeviceInline(ReadOnlyTabularInline):
    model = Device
    fields = ["index", "uuid", "name", "vram_total_mib", "vram_used_mib", "utilization_percent", "vanished_at"]
    readonly_fields = fields


class FindingInline(ReadOnlyTabularInline):
    model = Finding
    fields = ["code", "status", "message", "fix"]
    readonly_fields = fields


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["name", "health", "offline", "gpu_count", "driver_version", "attach", "last_seen"]
    list_filter = ["health", "offline", "attach", "driver_version"]
    search_fields = ["name"]
    readonly_fields = [f.name for f in Node._meta.fields]
    inlines = [DeviceInline, FindingInline]


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ["node", "index", "uuid", "name", "vram_used_mib", "vram_total_mib", "vanished_at"]
    list_filter = ["name"]
    search_fields = ["node__name", "uuid"]
    list_select_related = ["node"]
    actions = ["forget_vanished_gpus"]

    @admin.action(description="Forget the selected vanished GPUs (no longer lost capacity)", permissions=["forget"])
    def forget_vanished_gpus(self, request, queryset) -> None:
        forgotten = forget_vanished(queryset, request.user)
        self.message_user(request, f"{forgotten} vanished GPU{'s' if forgotten != 1 else ''} forgotten"
                                   " (GPUs their node still reports are kept).")

    def has_forget_permission(self, request) -> bool:
        # Who could delete a GPU row before: a superuser, or a user given the permission.
        return request.user.has_perm("fleet.delete_device")


@admin.register(Finding)
class FindingAdmin(ReadOnlyAdmin):
    list_display = ["node", "code", "status", "message"]
    list_filter = ["status", "code"]
    search_fields = ["node__name", "message"]
    list_select_related = ["node"]


@admin.register(DeviceSample)
class DeviceSampleAdmin(ReadOnlyAdmin):
    list_display = ["device", "collected_at", "vram_used_mib", "utilization_percent"]
    list_select_related = ["device__node"]
    date_hierarchy = "collected_at"


class NodeRollupAdmin(ReadOnlyAdmin):
    """Rollups are made by the housekeeping only; their figures are packed (gpu/rollups.py)."""

    list_display = ["node", "bucket", "gpu_count"]
    list_select_related = ["node"]
    search_fields = ["node__name"]

    @admin.display(description="GPUs")
    def gpu_count(self, rollup) -> int:
        return len(rollup.gpus())


admin.site.register(NodeRollup5m, NodeRollupAdmin)
admin.site.register(NodeRollup1h, NodeRollupAdmin)


@admin.register(XidAcknowledgement)
class XidAcknowledgementAdmin(ReadOnlyAdmin):
    list_display = ["node", "device_uuid", "by", "at"]
    search_fields = ["node__name", "device_uuid"]
    list_select_related = ["node", "by"]


@admin.register(NodeCredential)
class NodeCredentialAdmin(ReadOnlyAdmin):
    """Keys are issued, rotated and revoked by `manage.py enroll`, audited."""

    list_display = ["name", "generation", "issued_at", "revoked_at"]
    search_fields = ["name"]
    readonly_fields = ["name", "generation", "issued_at", "revoked_at"]
