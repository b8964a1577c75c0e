from django.contrib import admin

from gpufleet.fleet.models import (
    Device,
    DeviceSample,
    DeviceSample1h,
    DeviceSample5m,
    Finding,
    Node,
    NodeCredential,
    XidAcknowledgement,
)


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = ["index", "uuid", "name", "vram_total_mib", "vram_used_mib", "utilization_percent", "vanished_at"]
    readonly_fields = fields


class FindingInline(admin.TabularInline):
    model = Finding
    extra = 0
    fields = ["code", "status", "message", "fix"]
    readonly_fields = fields


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "health", "offline", "gpu_count", "driver_version", "attach", "last_seen"]
    list_filter = ["health", "offline", "attach", "driver_version"]
    search_fields = ["name"]
    readonly_fields = [f.name for f in Node._meta.fields]
    inlines = [DeviceInline, FindingInline]


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["node", "index", "uuid", "name", "vram_used_mib", "vram_total_mib", "vanished_at"]
    list_filter = ["name"]
    search_fields = ["node__name", "uuid"]
    list_select_related = ["node"]


@admin.register(Finding)
class FindingAdmin(admin.ModelAdmin):
    list_display = ["node", "code", "status", "message"]
    list_filter = ["status", "code"]
    search_fields = ["node__name", "message"]
    list_select_related = ["node"]


@admin.register(DeviceSample)
class DeviceSampleAdmin(admin.ModelAdmin):
    list_display = ["device", "collected_at", "vram_used_mib", "utilization_percent"]
    list_select_related = ["device__node"]
    date_hierarchy = "collected_at"


class SampleRollupAdmin(admin.ModelAdmin):
    """Rollups are made by the housekeeping only: shown, never edited here."""

    list_display = ["device", "bucket", "samples", "utilization_percent_avg", "utilization_percent_max",
                    "vram_used_mib_max", "temperature_c_max", "power_draw_w_max"]
    list_select_related = ["device__node"]
    search_fields = ["device__node__name", "device__uuid"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


admin.site.register(DeviceSample5m, SampleRollupAdmin)
admin.site.register(DeviceSample1h, SampleRollupAdmin)


@admin.register(XidAcknowledgement)
class XidAcknowledgementAdmin(admin.ModelAdmin):
    list_display = ["node", "device_uuid", "by", "at"]
    search_fields = ["node__name", "device_uuid"]
    list_select_related = ["node", "by"]


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    """Read-only: keys are issued, rotated and revoked by `manage.py enroll`, audited."""

    list_display = ["name", "generation", "issued_at", "revoked_at"]
    search_fields = ["name"]
    readonly_fields = ["name", "generation", "issued_at", "revoked_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
