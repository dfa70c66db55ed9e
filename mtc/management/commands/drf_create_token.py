"""Same command as DRF's (scripts and the README use it), for mtc's hashed tokens."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from mtc.models import ApiToken
from mtc.tokens import token_create


class Command(BaseCommand):
    help = "Create an API token for a user (-r replaces that user's earlier tokens)"

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "-r", "--reset", action="store_true", help="revoke the user's other tokens"
        )

    def handle(self, *args, **opts):
        user = get_user_model().objects.filter(username=opts["username"]).first()
        if user is None:
            raise CommandError(f"Cannot create the Token: user {opts['username']} does not exist")
        if opts["reset"]:
            ApiToken.objects.filter(user=user).delete()
        _, key = token_create(user=user, name="drf_create_token")
        self.stdout.write(f"Generated token {key} for user {user.username}")
