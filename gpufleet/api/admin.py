from django.contrib import admin

from gpufleet.api.models import ApiToken
from gpufleet.core.admin_readonly import ReadOnlyAdmin


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    # Tokens are made by their user on the "API tokens" page, the only place the secret is shown,
    # and revoked there (audited); deleting one here would revoke it with no trail.
    list_display = ["name", "user", "scope", "hint", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["scope"]
    search_fields = ["name", "user__username"]
    list_select_related = ["user"]
    readonly_fields = ["user", "name", "scope", "hint", "digest", "created_at", "last_used_at", "revoked_at"]
