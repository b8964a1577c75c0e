"""Users and groups in the admin site. A superuser may do anything there. Everyone else
who gets in (the admin role, or staff) manages users within the three roles only: they
see and change only users who hold no more than a role gives, may give a user only the
viewer, operator or admin group, and can never set superuser, staff or a single
permission; groups (the roles themselves) are read-only to them. Every add, change and
delete here sends `account_changed`, which the audit app records."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from gpufleet.core.roles import ROLE_PERMISSIONS
from gpufleet.core.signals import account_changed

# What only a superuser may set on a user: each of these gives more than a role does.
_SUPERUSER_ONLY_FIELDS = ("is_superuser", "is_staff", "user_permissions")


def account_state(obj) -> dict:
    """A user's or group's powers as the audit log shows them, before and after a change
    (never the password hash)."""
    if isinstance(obj, Group):
        return {"name": obj.name, "permissions": _permission_names(obj.permissions.all())}
    return {
        "username": obj.get_username(),
        "is_active": obj.is_active,
        "is_staff": obj.is_staff,
        "is_superuser": obj.is_superuser,
        "groups": sorted(obj.groups.values_list("name", flat=True)),
        "user_permissions": _permission_names(obj.user_permissions.all()),
    }


def _permission_names(permissions) -> list[str]:
    return sorted(f"{p.content_type.app_label}.{p.codename}" for p in permissions.select_related("content_type"))


class _AuditedAdmin(admin.ModelAdmin):
    """Sends account_changed after each add, change (password included) and delete.

    The state before a change is read when the admin loads the object (`get_object`),
    before the form writes into it, and kept on the request for `log_change`."""

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            request._account_before = (obj.pk, account_state(obj), getattr(obj, "password", None))
        return obj

    def log_addition(self, request, obj, message):
        entry = super().log_addition(request, obj, message)
        self._send(request, obj, "create", None, account_state(obj))
        return entry

    def log_change(self, request, obj, message):
        entry = super().log_change(request, obj, message)
        pk, before, password = getattr(request, "_account_before", (None, None, None))
        after = account_state(obj)
        if pk == obj.pk and password is not None and password != obj.password:
            after["password"] = "changed"
        self._send(request, obj, "update", before if pk == obj.pk else None, after)
        return entry

    def log_deletions(self, request, queryset):
        # Called before the rows go, so their state can still be read.
        entries = super().log_deletions(request, queryset)
        for obj in queryset:
            self._send(request, obj, "delete", account_state(obj), None)
        return entries

    def _send(self, request, obj, action: str, before, after) -> None:
        account_changed.send(
            sender=type(obj), actor=request.user, action=action, target=str(obj), before=before, after=after
        )


class RoleUserAdmin(_AuditedAdmin, UserAdmin):
    def get_queryset(self, request):
        users = super().get_queryset(request)
        if request.user.is_superuser:
            return users
        # Only users who hold no more than the roles give: changing anyone else (a
        # superuser's password, say) would hand over more than the admin role has.
        return users.filter(is_superuser=False, user_permissions__isnull=True).exclude(
            groups__in=Group.objects.exclude(name__in=ROLE_PERMISSIONS)
        )

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else fields + _SUPERUSER_ONLY_FIELDS

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.name == "groups" and not request.user.is_superuser:
            kwargs["queryset"] = Group.objects.filter(name__in=ROLE_PERMISSIONS).order_by("name")
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class RoleGroupAdmin(_AuditedAdmin, GroupAdmin):
    """The roles' permissions are kept in step with gpufleet/core/roles.py after every
    migrate; only a superuser may add, change or delete a group."""

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


admin.site.unregister(User)
admin.site.register(User, RoleUserAdmin)
admin.site.unregister(Group)
admin.site.register(Group, RoleGroupAdmin)
