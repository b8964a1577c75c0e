from django.contrib import admin

from gpufleet.fleet.models import Device, DeviceSample, Finding, Node, XidAcknowledgement


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


@admin.register(XidAcknowledgement)
class XidAcknowledgementAdmin(admin.ModelAdmin):
    list_display = ["node", "device_uuid", "by", "at"]
    search_fields = ["node__name", "device_uuid"]
    list_select_related = ["node", "by"]
