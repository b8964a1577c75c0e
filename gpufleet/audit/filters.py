"""The audit log's filters (the page's, and built for the API's)."""

from __future__ import annotations

import django_filters

from gpufleet.audit.models import Action, AuditEntry
from gpufleet.core.filters import ListFilterSet


class AuditFilter(ListFilterSet):
    """`node` (exact node name, kept on the row, so deleted nodes too) and `action`.

    `AuditFilter(request.GET, queryset=AuditEntry.objects.all())`, then
    `is_valid()`, `errors` and `qs` (newest first; empty while invalid)."""

    node = django_filters.CharFilter(field_name="node_name", max_length=200, label="Node")
    action = django_filters.ChoiceFilter(choices=Action.choices, empty_label="Any action", label="Action")

    class Meta:
        model = AuditEntry
        fields = ["node", "action"]
