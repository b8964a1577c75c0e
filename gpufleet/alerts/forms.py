"""The alert pages' forms. A channel's URL field never shows the stored URL: on an edit
it is empty, and left empty keeps the URL."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.utils import timezone

from gpufleet.alerts import channels
from gpufleet.alerts.models import Channel, Format, Rule, Silence, Status
from gpufleet.events.models import Kind


class ChannelForm(forms.Form):
    name = forms.CharField(max_length=100)
    url = forms.CharField(
        label="apprise URL", required=False, strip=True,
        # A password field: the browser neither shows it over a shoulder nor keeps it in history.
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off", "spellcheck": "false"}),
        help_text="Such as mailtos://user:password@smtp.example.com?to=ops@example.com or "
                  "json://hooks.example.com/gpufleet. Shown only as its scheme once saved.",
    )

    format = forms.ChoiceField(choices=Format.choices, initial=Format.APPRISE, required=False,
                               help_text="Alertmanager's format is posted to an http(s):// or json(s):// URL.")

    def __init__(self, *args, editing: Channel | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            self.fields["url"].help_text = (f"Now {editing.redacted}. Leave empty to keep it; type a whole new "
                                            "URL to replace it.")

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        taken = Channel.objects.filter(name=name)
        if self.editing is not None:
            taken = taken.exclude(pk=self.editing.pk)
        if taken.exists():
            raise forms.ValidationError("Another channel has this name.", code="duplicate")
        return name

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        if not url:
            if self.editing is None:
                raise forms.ValidationError("An apprise URL is needed.", code="required")
            return ""
        return url

    def clean(self) -> dict:
        cleaned = super().clean()
        # Left out (a form from before the field): the channel's own, else apprise.
        format = cleaned["format"] = cleaned.get("format") or getattr(self.editing, "format", Format.APPRISE)
        url = cleaned.get("url")
        if "url" in cleaned and (url or self.editing is not None):
            problem = channels.problem(url or self.editing.url, format)
            if problem is not None:
                self.add_error("url" if url else "format", forms.ValidationError(problem, code="invalid"))
        return cleaned


class RuleForm(forms.ModelForm):
    kinds = forms.MultipleChoiceField(choices=Kind.choices, required=False, widget=forms.CheckboxSelectMultiple,
                                      help_text="None selected: every kind.")

    class Meta:
        model = Rule
        fields = ["name", "channels", "kinds", "min_severity", "nodes", "gpu_model", "wait_minutes", "repeat_hours",
                  "notify_resolved", "enabled"]
        widgets = {"channels": forms.CheckboxSelectMultiple}
        labels = {"min_severity": "Minimum severity", "nodes": "Nodes", "gpu_model": "GPU model",
                  "wait_minutes": "Wait (minutes)", "repeat_hours": "Repeat (hours)",
                  "notify_resolved": "Send recoveries"}


class SilenceForm(forms.ModelForm):
    class Meta:
        model = Silence
        fields = ["nodes", "starts_at", "ends_at", "reason"]
        widgets = {
            "starts_at": forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
            "ends_at": forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        }
        labels = {"starts_at": "Starts", "ends_at": "Ends"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.is_bound and self.instance.pk is None:
            now = timezone.localtime().replace(second=0, microsecond=0)
            self.initial.setdefault("starts_at", now)
            self.initial.setdefault("ends_at", now + timedelta(hours=2))

    def clean(self):
        data = super().clean()
        if data.get("starts_at") and data.get("ends_at") and data["ends_at"] <= data["starts_at"]:
            self.add_error("ends_at", "A silence ends after it starts.")
        return data


class DeliveryFilterForm(forms.Form):
    status = forms.ChoiceField(choices=[("", "Any")] + Status.choices, required=False)
    channel = forms.ModelChoiceField(Channel.objects.all(), required=False, empty_label="Any")
