"""What the test provider says about a user: the claims a directory-backed provider such as
Keycloak sends (names, email, the user's groups in `groups`), and, when a refusal test asks
through the misbehaviour file, an ID token with a wrong issuer, audience, nonce, subject or
expiry, still signed with the provider's real key."""

import json
import os
import time
from pathlib import Path

from oauth2_provider.oauth2_validators import OAuth2Validator


class DirectoryClaims(OAuth2Validator):
    # Keycloak's group mapper sits in a default client scope: the groups come with "profile" here.
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "profile"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "name": user.get_full_name(),
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration_time = super().get_id_token_dictionary(token, token_handler, request)
        misbehave = Path(os.environ["OIDC_PROVIDER_MISBEHAVE"])
        if misbehave.exists():
            wrong = json.loads(misbehave.read_text() or "{}")
            if "expired" in wrong:
                now = int(time.time())
                claims.update(iat=now - 2 * wrong["expired"], exp=now - wrong["expired"])
            claims.update({k: v for k, v in wrong.items() if k in ("iss", "aud", "azp", "nonce", "sub")})
        return claims, expiration_time
