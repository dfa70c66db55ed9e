"""The profile page: who you are to mtc and to Unix."""

from django.shortcuts import render

from .selectors import identity_mode
from .services import IdentityMissing, account_ensure


def profile(request):
    try:
        account, missing = account_ensure(user=request.user), ""
    except IdentityMissing as exc:
        account, missing = None, str(exc)
    return render(
        request,
        "identity/profile.html",
        {"account": account, "missing": missing, "mode": identity_mode()},
        status=403 if missing else 200,
    )
