from django.contrib import admin

from gpufleet.core.admin_readonly import ReadOnlyAdmin
from gpufleet.sso.models import Identity


@admin.register(Identity)
class IdentityAdmin(ReadOnlyAdmin):
    """Where each single sign-on user came from and what their groups gave at their last
    login; written only by a login (gpufleet/sso/services.py)."""

    list_display = ["user", "source", "subject", "role", "refused", "seen_at"]
    list_filter = ["source", "role", "refused"]
    search_fields = ["user__username", "subject"]
    # The refresh token is a credential: never shown.
    exclude = ["refresh_token"]
    readonly_fields = [f.name for f in Identity._meta.fields if f.name != "refresh_token"]
