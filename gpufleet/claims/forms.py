"""The claim editor's form. It only collects what the user means (a count, every GPU
or chosen GPUs); whether that fits the node is the ledger's call, made through
`gpufleet.claims.services`, and its reason is shown at the field it is about."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.validators import MaxValueValidator
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims import rights, services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Device, Node
from gpufleet.gpu import availability
from gpufleet.teams.models import Team

COUNT, ALL, DEVICES = "count", "all", "devices"
MODES = [(COUNT, "A number of GPUs"), (ALL, "All GPUs"), (DEVICES, "These GPUs")]

# Which field a refusal is about. "insufficient" belongs to whatever said how many
# GPUs are wanted: the count, the "all GPUs" choice, or the ticked GPUs.
_FIELD_FOR_CODE = {
    "unknown_device": DEVICES,
    "duplicate_device": DEVICES,
    "device_taken": DEVICES,
    "name_taken": "name",
    "invalid": "name",  # only a bad claim name reaches the form with this code
    "no_gpu": None,
    "runtime_missing": None,
    "stale": None,
    "gone": None,
    "version_required": None,
    "series_conflict": "repeat",
    "forbidden": None,  # a refusal by the rights; a reason to book over quota names its own field
}
_FIELD_FOR_MODE = {COUNT: "count", ALL: "mode", DEVICES: DEVICES}


class DeviceChoiceField(forms.MultipleChoiceField):
    """The node's GPUs as checkboxes. Any id passes here: whether it names a GPU of
    the node, and only once, is for the ledger to say (in its own words)."""

    widget = forms.CheckboxSelectMultiple

    def valid_value(self, value) -> bool:
        return True


class ClaimForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="The workload holding the GPUs, e.g. a job or a team.")
    # The teams the person may book for (set per person); with one, it is theirs, not asked.
    # Not sent: the edited claim's team, or the person's only one (services.allowed_team).
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        to_field_name="name",
        required=False,
        empty_label=None,
        help_text="The team the claim is for: its members may change the claims they own, its leads and operators all of them.",
    )
    mode = forms.ChoiceField(choices=MODES, widget=forms.RadioSelect, initial=COUNT, label="Reserve")
    count = forms.IntegerField(min_value=1, required=False, label="How many GPUs")
    devices = DeviceChoiceField(required=False, label="Which GPUs")
    # A user name typed, not a choice of every user: a site's directory may hold thousands,
    # each one an option drawn on every node page.
    owner = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True),
        to_field_name="username",
        required=False,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
        error_messages={"invalid_choice": "No active user has that user name."},
        help_text="Who answers for the claim: their user name here (empty: nobody).",
    )
    contact = forms.CharField(
        max_length=Claim._meta.get_field("contact").max_length,
        required=False,
        help_text="How to reach the owner, e.g. a chat channel.",
    )
    starts_at = forms.DateTimeField(
        required=False,
        label="Starts",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=f"Empty: now. A later start books the GPUs ahead; they are held from then. Times are the site's "
                  f"({settings.TIME_ZONE}).",
    )
    ends_at = forms.DateTimeField(
        required=False,
        label="Ends",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Empty: no end. From then the GPUs are free for other claims.",
    )
    repeat = forms.CharField(
        required=False,
        max_length=500,
        label="Repeats",
        help_text="Empty: once. An iCalendar rule with an end, e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12 (Tuesdays, 12 "
                  "times) or FREQ=DAILY;UNTIL=20270115T000000Z: Starts and Ends give the first; every occurrence is "
                  "booked as its own claim, or none.",
    )
    quota_override_reason = forms.CharField(
        required=False,
        max_length=1000,
        label="Over quota, because",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Admins only. Empty: the claim must keep within its team's quotas. A reason books it over them; "
                  "it is kept on the claim and in the audit log.",
    )
    updated_at = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(
        self,
        *args,
        node: Node,
        ledger: gpu.Ledger,
        devices: list[Device],
        user=None,
        person: rights.Rights | None = None,
        editing: Claim | None = None,
        action_url: str = "",
        validate_url: str = "",
        quota_override: bool = False,
        **kwargs,
    ):
        data = args[0] if args else kwargs.get("data")
        if editing is not None and data is None:
            kwargs.setdefault("initial", _initial(editing, ledger))
        super().__init__(*args, **kwargs)
        self.node = node
        self.user = user
        self.ledger = ledger
        self.editing = editing
        self.action_url = action_url
        self.validate_url = validate_url
        # After a refused submit the form carries the claim's current version, so the
        # next save (after the user has reviewed it) goes through.
        self.refresh_version = False
        # Set by clean() when an edit came without a readable version token.
        self.version_refused = False
        self._version: datetime | None = None
        if editing is not None:
            del self.fields["repeat"]  # an occurrence is changed on its own
        if not quota_override:
            del self.fields["quota_override_reason"]  # admins only (gpufleet.claims.quota.may_override)
        self._limit_teams(person if person is not None else rights.of(user), editing)
        self.fields["devices"].choices = _device_choices(ledger, devices, self._chosen())

    def _limit_teams(self, person: rights.Rights, editing: Claim | None) -> None:
        teams = rights.bookable_teams(person)
        if editing is not None and editing.team_id is not None:
            teams = teams | Team.objects.filter(pk=editing.team_id)  # kept even when its editor may not book for it
        field = self.fields["team"]
        field.queryset = teams.distinct()
        offered = list(field.queryset)
        if len(offered) == 1:
            # One team to book for: theirs, shown as text (the template reads `only_team`).
            self.only_team = offered[0]
            field.widget = forms.HiddenInput()
            field.initial = offered[0].name
        else:
            self.only_team = None
            field.choices = [(team.name, team.name) for team in offered]  # read once, however often drawn
        if editing is not None and editing.team_id is not None and not self.is_bound:
            self.initial["team"] = editing.team.name

    def _chosen(self) -> list[str]:
        if self.is_bound:
            return self.data.getlist(self.add_prefix(DEVICES)) if hasattr(self.data, "getlist") else []
        return list(self.initial.get(DEVICES, []))

    @property
    def version(self) -> str:
        """The hidden updated_at to render: what the editor loaded, or the current one."""
        if self.editing is None:
            return ""
        if self.is_bound and not self.refresh_version:
            return self.data.get(self.add_prefix("updated_at"), "")
        return self.editing.updated_at.isoformat()

    def expected_updated_at(self) -> datetime | None:
        """The version the edit was loaded at (None for a new claim). Call after is_valid()."""
        return self._version

    def terms(self) -> services.Terms:
        """Owner, contact and window as the services take them. Call after is_valid()."""
        data = self.cleaned_data
        return services.Terms(owner=data.get("owner"), team=data.get("team"), contact=data.get("contact", ""),
                              starts_at=data.get("starts_at"), ends_at=data.get("ends_at"))

    def clean(self) -> dict:
        data = super().clean()
        if self.editing is not None:
            # An edit without the version it was loaded at could overwrite a change made
            # meanwhile unseen, so it is refused like a stale one, never saved unchecked.
            try:
                self._version = services.parse_version(data.get("updated_at"))
            except services.VersionRequired as exc:
                self.version_refused = True
                self.add_claim_error(exc)
            else:
                if services.is_stale(self.editing, self._version):
                    self.add_claim_error(services.StaleClaim())
        mode = data.get("mode")
        if mode == COUNT and data.get("count") is None and "count" not in self.errors:
            # A count of 0 would mean every GPU; that is its own choice.
            self.add_error("count", "Say how many GPUs, or choose “All GPUs”.")
        if mode == DEVICES and not data.get(DEVICES):
            self.add_error(DEVICES, "Tick at least one GPU, or choose another option.")
        if self.errors:
            return data
        try:
            services.allowed_team(self.user, self.editing, self.terms())
        except services.ClaimError as exc:
            self.add_claim_error(exc)
            return data
        proposed = self.proposed()
        if self.repeat_rule():
            try:
                services.plan_series(self.node, proposed, self.terms(), self.repeat_rule())
            except services.ClaimError as exc:
                self.add_claim_error(exc)
            return data
        bad_terms = services.check_terms(self.terms(), self.editing)
        if bad_terms is not None:
            self.add_error(bad_terms.field, bad_terms.message)
        taken = services.check_name(self.node, proposed.name, self.editing)
        if taken is not None:
            self.add_claim_error(taken)
        # Without a window to check it over, the ledger has nothing to say.
        error = services.check_claim(self.node, proposed, self.editing) if bad_terms is None else None
        if error is not None:
            self.add_claim_error(services.ClaimRejected(error))
        return data

    @property
    def offers_override(self) -> bool:
        return "quota_override_reason" in self.fields

    def override_reason(self) -> str | None:
        """The admin's reason to book over quota; None where the form does not offer one
        (the claim keeps its own). Call after is_valid()."""
        return self.cleaned_data.get("quota_override_reason", "") if self.offers_override else None

    def repeat_rule(self) -> str:
        """The repeat rule of a new claim ("": once). Call after is_valid()."""
        return self.cleaned_data.get("repeat", "").strip()

    def proposed(self) -> gpu.Claim:
        """The claim as the domain sees it (no start: from now). Call after is_valid()."""
        data = self.cleaned_data
        team = data.get("team") or (self.editing.team if self.editing is not None and self.editing.team_id else None)
        window = {"starts_at": data.get("starts_at"), "ends_at": data.get("ends_at"), "team": team.name if team else ""}
        if data["mode"] == DEVICES:
            return gpu.Claim(name=data["name"], device_ids=tuple(data[DEVICES]), **window)
        if data["mode"] == ALL:
            return gpu.Claim(name=data["name"], count=0, **window)
        return gpu.Claim(name=data["name"], count=data["count"], **window)

    def add_claim_error(self, error: services.ClaimError) -> None:
        """Show a refusal at the field it is about (or above the form)."""
        if isinstance(error, (services.BadTerms, services.OverrideRefused)):
            field = error.field
        elif error.code == "insufficient":
            field = _FIELD_FOR_MODE.get(getattr(self, "cleaned_data", {}).get("mode"), "count")
        else:
            field = _FIELD_FOR_CODE.get(error.code)
        if field is not None and field not in self.fields:
            field = None
        self.add_error(field, error.message)


def _initial(claim: Claim, ledger: gpu.Ledger) -> dict:
    initial = {
        "name": claim.name,
        "mode": claim.mode,
        "updated_at": claim.updated_at.isoformat(),
        "owner": claim.owner if claim.owner_id else None,
        "contact": claim.contact,
        "quota_override_reason": claim.quota_override_reason,
        "starts_at": timezone.localtime(claim.starts_at),
        "ends_at": timezone.localtime(claim.ends_at) if claim.ends_at else None,
    }
    if claim.mode == COUNT:
        initial["count"] = claim.count
    if claim.mode == DEVICES:
        # Tick by UUID (a GPU's index can change across reboots); keep ids the node
        # no longer has as they are, so the ledger can say so.
        initial[DEVICES] = [_uuid_or_id(ledger, device_id) for device_id in claim.device_ids]
    return initial


def _uuid_or_id(ledger: gpu.Ledger, device_id: str) -> str:
    device = ledger.resolve(device_id)
    return device.uuid if device is not None else device_id


def _device_choices(ledger: gpu.Ledger, devices: list[Device], chosen: list[str]) -> list[tuple[str, str]]:
    choices = []
    for device in devices:
        holder = ledger.holder_of(device.index)
        held = f"held by {holder}" if holder else "not pinned"
        choices.append((device.uuid, f"GPU {device.index} · {device.name} · {device.uuid} · {held}"))
    known = {uuid for uuid, _ in choices}
    for device_id in chosen:
        if device_id not in known and ledger.resolve(device_id) is None:
            choices.append((device_id, f"{device_id} · no longer reported by the node"))
            known.add(device_id)
    return choices


class PlacementForm(forms.Form):
    """The "find a node" question; the answer is the ledger's (gpufleet.gpu.place)."""

    count = forms.IntegerField(min_value=1, max_value=1024, required=False, initial=1, label="GPUs")
    whole_node = forms.BooleanField(required=False, label="All GPUs of one node")
    model = forms.CharField(
        max_length=100, required=False, label="Model", widget=forms.TextInput(attrs={"placeholder": "e.g. H200"})
    )
    min_free_vram_gib = forms.DecimalField(
        min_value=0, max_value=100000, decimal_places=1, required=False, label="Free VRAM per GPU (GiB)"
    )

    def clean(self) -> dict:
        data = super().clean()
        if not data.get("whole_node") and data.get("count") is None and "count" not in self.errors:
            self.add_error("count", "Say how many GPUs, or tick “All GPUs of one node”.")
        return data

    def placement_request(self) -> gpu.PlacementRequest:
        data = self.cleaned_data
        gib = data.get("min_free_vram_gib") or 0
        return gpu.PlacementRequest(
            count=0 if data["whole_node"] else data["count"],
            model=data.get("model", "").strip(),
            min_free_vram_mib=int(gib * 1024),
        )


class SlotForm(forms.Form):
    """The "find a slot" question; the answer is the ledger's (gpufleet.gpu.availability)."""

    count = forms.IntegerField(min_value=1, max_value=1024, initial=1, label="GPUs")
    model = forms.CharField(
        max_length=100, required=False, label="Model", widget=forms.TextInput(attrs={"placeholder": "e.g. H100"})
    )
    min_vram_gib = forms.DecimalField(
        min_value=0, max_value=100000, decimal_places=1, required=False, label="Memory per GPU (GiB)"
    )
    duration_hours = forms.DecimalField(min_value=Decimal("0.25"), decimal_places=2, initial=1, label="For (hours)")
    after = forms.DateTimeField(
        required=False,
        label="From",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=f"Empty: now. In the site's time ({settings.TIME_ZONE}).",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The longest window a claim may have (read here, so that a test's setting counts).
        self.fields["duration_hours"].validators.append(MaxValueValidator(settings.GPUFLEET_MAX_RESERVATION_DAYS * 24))

    def slot_request(self, now: datetime) -> availability.SlotRequest:
        data = self.cleaned_data
        return availability.SlotRequest(
            after=data.get("after") or now,
            duration=timedelta(hours=float(data["duration_hours"])),
            count=data["count"],
            model=data.get("model", "").strip(),
            min_vram_mib=int((data.get("min_vram_gib") or 0) * 1024),
        )
