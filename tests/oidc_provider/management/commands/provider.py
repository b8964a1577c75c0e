"""Sets the test provider up from a test: `provider client ID SECRET URI...` registers the site as
a confidential client (PKCE, no consent screen), `provider user NAME PASSWORD [--group G ...]`
makes or changes a directory user, their groups replaced."""

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from oauth2_provider.models import Application


class Command(BaseCommand):
    def add_arguments(self, parser):
        kinds = parser.add_subparsers(dest="kind", required=True)
        client = kinds.add_parser("client")
        client.add_argument("client_id")
        client.add_argument("secret")
        client.add_argument("redirect_uris", nargs="+")
        client.add_argument("--logout-uri", action="append", default=[])
        user = kinds.add_parser("user")
        user.add_argument("username")
        user.add_argument("password")
        user.add_argument("--email", default="")
        user.add_argument("--first-name", default="")
        user.add_argument("--last-name", default="")
        user.add_argument("--group", action="append", default=[])

    def handle(self, *args, kind, **options):
        if kind == "client":
            Application.objects.update_or_create(client_id=options["client_id"], defaults={
                "name": options["client_id"], "client_secret": options["secret"],
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "algorithm": Application.RS256_ALGORITHM, "skip_authorization": True,
                "redirect_uris": " ".join(options["redirect_uris"]),
                "post_logout_redirect_uris": " ".join(options["logout_uri"]),
            })
        else:
            user, _ = User.objects.update_or_create(username=options["username"], defaults={
                "email": options["email"], "first_name": options["first_name"], "last_name": options["last_name"],
            })
            user.set_password(options["password"])
            user.save()
            user.groups.set([Group.objects.get_or_create(name=name)[0] for name in options["group"]])
