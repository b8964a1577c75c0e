"""The node page's "acknowledge" button for a GPU's Xid errors."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from gpufleet.core.access import ACKNOWLEDGE_XID, requires
from gpufleet.fleet.models import Node
from gpufleet.fleet.xids import NothingToAcknowledge, acknowledge_xids


@require_POST
@requires(ACKNOWLEDGE_XID)
def acknowledge_xid(request, name: str, index: int):
    """Clear GPU `index`'s Xid finding until a newer Xid, then back to the node page
    (a plain form post: the table, the findings and the header all change)."""
    node = get_object_or_404(Node, name=name)
    try:
        acknowledge_xids(node, index, request.user)
    except NothingToAcknowledge as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(request, f"Xid errors of GPU {index} acknowledged; a newer Xid will show again.")
    return redirect("fleet:node_detail", name=node.name)
