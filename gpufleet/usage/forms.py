"""The Usage page's question as GET parameters: the period (a preset, or from and to
days), what to group by, how to sort, and what to narrow to. Bookmarkable, and the
form works without JavaScript."""

from __future__ import annotations

from datetime import datetime

from django import forms

from gpufleet.usage import period as periods
from gpufleet.usage import query
from gpufleet.usage.report import GROUPS, Row

BY = {"owner": "Owner", "team": "Team", "claim": "Claim", "image": "Image", "label": "Claim label",
      "node": "Node", "model": "GPU model"}
assert set(BY) == set(GROUPS)
PRESETS = {"day": "Today", "week": "This week", "month": "This month"}
assert set(PRESETS) == set(periods.PRESETS)


def _efficiency(row: Row) -> float | None:
    return row.efficiency


# Each figure column the table sorts by, and how to read it from a row (None sorts last).
SORTS = {
    "reserved": lambda row: row.reserved,
    "used": lambda row: row.used,
    "idle_reserved": lambda row: row.idle_reserved,
    "used_unreserved": lambda row: row.used_unreserved,
    "efficiency": _efficiency,
    "energy": lambda row: row.energy_kwh,
    "cost": lambda row: row.cost,
    "unknown": lambda row: row.unknown,
}
BIGINT = 2**63 - 1


class UsageForm(forms.Form):
    """`by`, `period` (day, week or month so far) or `from` and `to` (YYYY-MM-DD,
    both days included, which win over the preset), `sort` (a key of SORTS, "-key"
    largest first) and the report's filters (`owner`, `team`, `claim_id`, `node_id`,
    `image`, `model`). The fields draw the form; the values are read by gpufleet/usage/query.py,
    in the API's words."""

    by = forms.ChoiceField(choices=list(BY.items()), required=False, label="Group by")
    period = forms.ChoiceField(choices=list(PRESETS.items()), required=False, widget=forms.HiddenInput)
    owner = forms.CharField(max_length=150, required=False, label="Owner",
                            widget=forms.TextInput(attrs={"placeholder": "user name"}))
    team = forms.CharField(max_length=100, required=False, label="Team",
                           widget=forms.TextInput(attrs={"placeholder": "team name"}))
    image = forms.CharField(max_length=200, required=False, label="Image",
                            widget=forms.TextInput(attrs={"placeholder": "container image"}))
    model = forms.CharField(max_length=500, required=False, label="GPU model",
                            widget=forms.TextInput(attrs={"placeholder": "e.g. NVIDIA H100 80GB HBM3"}))
    claim_id = forms.IntegerField(min_value=1, max_value=BIGINT, required=False, widget=forms.HiddenInput)
    node_id = forms.IntegerField(min_value=1, max_value=BIGINT, required=False, widget=forms.HiddenInput)
    sort = forms.ChoiceField(choices=[(key, key) for key in SORTS] + [(f"-{key}", f"-{key}") for key in SORTS],
                             required=False, widget=forms.HiddenInput)

    def __init__(self, data=None, *, now: datetime, **kwargs):
        super().__init__(data, **kwargs)
        self.now = now
        # Read as the API and `manage.py usage` read the same parameters.
        self.query: query.Query | None = None
        # "from" is a Python keyword: these two are added by name.
        self.fields["from"] = forms.CharField(max_length=20, required=False, label="From",
                                              widget=forms.DateInput(attrs={"type": "date"}))
        self.fields["to"] = forms.CharField(max_length=20, required=False, label="To",
                                            widget=forms.DateInput(attrs={"type": "date"}))
        self.order_fields(["by", "owner", "team", "image", "model", "from", "to"])

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        params = {name: self.data.get(name) for name in query.PARAMETERS}
        if params["from"] or params["to"]:
            # Days typed win over the preset the page carried along.
            params["period"] = None
        try:
            self.query = query.read(params, self.now)
        except query.QueryError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, str(exc))
        return cleaned

    @property
    def asked(self) -> periods.Period | None:
        """The period asked for (none while the form is invalid). Not `period`: that
        is the preset's field."""
        return self.query.period if self.is_valid() else None

    @property
    def group(self) -> str:
        """What the rows are grouped by (owner unless asked)."""
        return self._value("by") or query.DEFAULT_GROUP

    @property
    def current_sort(self) -> str:
        return self._value("sort")

    @property
    def filters(self) -> dict:
        """The report's filters asked for (none while the form is invalid)."""
        return self.query.filters if self.is_valid() else {}

    def _value(self, name: str):
        self.is_valid()
        return (getattr(self, "cleaned_data", None) or {}).get(name) or ""


def sort_rows(rows: list[Row], sort: str) -> list[Row]:
    """`rows` by a figure column (the report's order breaks ties); none: as they are."""
    if not sort:
        return rows
    figure = SORTS[sort.lstrip("-")]
    descending = sort.startswith("-")
    known = [row for row in rows if figure(row) is not None]
    unknown = [row for row in rows if figure(row) is None]
    return sorted(known, key=figure, reverse=descending) + unknown
