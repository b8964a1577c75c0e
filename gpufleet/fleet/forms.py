"""The node page's maintenance form: until when and why (gpufleet/fleet/maintenance.py)."""

from __future__ import annotations

from django import forms

from gpufleet.fleet.models import Maintenance


class MaintenanceForm(forms.Form):
    until = forms.DateTimeField(
        label="Until",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="In the site's time zone.",
    )
    reason = forms.CharField(label="Reason", max_length=Maintenance.REASON_MAX)
    validate = forms.TypedChoiceField(
        label="Afterwards", required=False, coerce=int, empty_value=None,
        choices=[("", "back in service"), (1, "in validation until DCGM -r 1 passes"),
                 (2, "in validation until DCGM -r 2 passes")],
        help_text="In validation, the node takes no new claim until a DCGM diagnostic of that level passes.",
    )
