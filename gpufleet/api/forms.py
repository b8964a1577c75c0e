from django import forms

from gpufleet.api.models import ApiToken


class TokenForm(forms.ModelForm):
    """A new token of `user`; a name they already use on a live token is refused, so two
    tokens in the list can always be told apart (and a resubmitted form makes none)."""

    class Meta:
        model = ApiToken
        fields = ["name", "scope"]
        widgets = {"scope": forms.RadioSelect}
        help_texts = {"scope": "A read-write token writes only what your role may write."}

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if ApiToken.objects.filter(user=self.user, name=name, revoked_at__isnull=True).exists():
            raise forms.ValidationError(
                "You already have a token named “%(name)s”: revoke it first, or pick another name.",
                code="duplicate", params={"name": name},
            )
        return name
