"""Signals that core sends and the apps above it answer (core imports no app)."""

from django.dispatch import Signal

# A user or group was added, changed or deleted in the admin site (gpufleet/core/admin.py).
# Sent with sender=the model, actor (the user who did it), action ("create", "update" or
# "delete"), target (the object's name), before and after (account_state dicts, None for
# a side that does not exist). gpufleet/audit/receivers.py writes the audit row.
account_changed = Signal()
