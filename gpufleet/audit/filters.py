"""The audit log's filters (the page's, and built for the API's)."""

from __future__ import annotations

import django_filters

from gpufleet.audit.models import AuditEntry
from gpufleet.core.filters import ListFilterSet

# What the apps record (gpufleet.claims.services, gpufleet.jobs.services); a new
# action needs its line here to be filterable.
ACTION_CHOICES = [
    ("claim.create", "Claim added"),
    ("claim.update", "Claim changed"),
    ("claim.delete", "Claim deleted"),
    ("node.diagnose", "Diagnosis asked"),
    ("node.fix", "Fix asked"),
    ("xid.acknowledge", "Xid errors acknowledged"),
    ("token.create", "API token created"),
    ("token.revoke", "API token revoked"),
    # The admin site's user and group changes, and login lockouts (gpufleet.audit.receivers).
    ("user.create", "User added"),
    ("user.update", "User changed"),
    ("user.delete", "User deleted"),
    ("group.create", "Group added"),
    ("group.update", "Group changed"),
    ("group.delete", "Group deleted"),
    ("login.lockout", "Login locked out"),
]


class AuditFilter(ListFilterSet):
    """`node` (exact node name, kept on the row, so deleted nodes too) and `action`.

    `AuditFilter(request.GET, queryset=AuditEntry.objects.all())`, then
    `is_valid()`, `errors` and `qs` (newest first; empty while invalid)."""

    node = django_filters.CharFilter(field_name="node_name", max_length=200, label="Node")
    action = django_filters.ChoiceFilter(choices=ACTION_CHOICES, empty_label="Any action", label="Action")

    class Meta:
        model = AuditEntry
        fields = ["node", "action"]
