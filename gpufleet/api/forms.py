from django import forms

from gpufleet.api.models import ApiToken


class TokenForm(forms.ModelForm):
    class Meta:
        model = ApiToken
        fields = ["name", "scope"]
        widgets = {"scope": forms.RadioSelect}
        help_texts = {"scope": "A read-write token writes only what your role may write."}
