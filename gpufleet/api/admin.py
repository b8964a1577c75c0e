from django.contrib import admin

from gpufleet.api.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    # Tokens are made by their user on the "API tokens" page, the only place the secret is shown.
    list_display = ["name", "user", "scope", "hint", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["scope"]
    search_fields = ["name", "user__username"]
    list_select_related = ["user"]
    readonly_fields = ["user", "name", "scope", "hint", "digest", "created_at", "last_used_at", "revoked_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
