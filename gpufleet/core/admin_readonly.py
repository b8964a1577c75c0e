"""Admin classes for rows that only a service may write: claims (the ledger, under the
node's lock), audit rows, jobs, node credentials, what ingest stores (nodes, GPUs,
findings, history), Xid acknowledgements and API tokens. A change made in the admin
would skip that service's audit row and leave the node's figures wrong, so the admin
site shows these rows and nothing more, to a superuser too."""

from __future__ import annotations

from django.contrib import admin


class _ReadOnly:
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        # Also takes "delete selected" out of the changelist's actions, and refuses
        # deleting a row (a node, say) that would take these rows along.
        return False


class ReadOnlyAdmin(_ReadOnly, admin.ModelAdmin):
    """Shown, never added, changed or deleted here."""


class ReadOnlyTabularInline(_ReadOnly, admin.TabularInline):
    """An inline of such rows: no add row, no delete box."""

    extra = 0
