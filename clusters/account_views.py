"""Slurm account pages for operators: the list (shares, QoS, limits, GPU-minute budget,
members) and forms to create, edit and delete an account and add or remove a member.
They call the services the API calls (clusters.accounts); bad input comes back beside
its field, and a Slurm that refuses or cannot be reached is said on the form, never a
500. Others get the 403 page."""

from __future__ import annotations

from functools import wraps

from django import forms
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from slurm import SlurmError

from . import accounts
from .models import SlurmAccount

TRES_HELP = "TRES=count pairs, e.g. gres/gpu=16 or cpu=64,gres/gpu=8; empty: no limit."


class AccountForm(forms.Form):
    """The account's fields as text; clusters.accounts.validate decides what is valid."""

    name = forms.CharField(
        max_length=40,
        help_text="Lower-case letters, digits, _ and -, starting with a letter.",
    )
    description = forms.CharField(max_length=200, required=False)
    shares = forms.IntegerField(
        required=False, help_text="Fair-share weight against other accounts; empty: Slurm's 1."
    )
    qos = forms.CharField(label="QoS", max_length=200, required=False)
    grp_tres = forms.CharField(
        label="GrpTRES (all its jobs)", max_length=200, required=False, help_text=TRES_HELP
    )
    max_tres_per_user = forms.CharField(
        label="MaxTRESPerUser", max_length=200, required=False, help_text=TRES_HELP
    )
    grp_tres_mins = forms.CharField(
        label="GPU-minute budget (GrpTRESMins)",
        max_length=200,
        required=False,
        help_text="e.g. gres/gpu=6000; empty: no budget.",
    )

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing:
            del self.fields["name"]

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        data = {k: v for k, v in cleaned.items() if k != "name"}
        if not self.editing:
            data["name"] = cleaned.get("name", "")
            # A new account sets only what was filled in.
            data = {k: v for k, v in data.items() if v not in ("", None) or k == "name"}
        try:
            self.account_data = accounts.validate(data, partial=self.editing)
        except accounts.AccountError as exc:
            for field, message in exc.fields.items():
                self.add_error(field if field in self.fields else None, message)
        return cleaned


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150, label="User")

    def clean_username(self) -> str:
        name = self.cleaned_data["username"].strip()
        self.user = accounts.user_get(name)
        if self.user is None:
            raise forms.ValidationError(f"No user '{name}'.")
        return name


def staff_required(view):
    """Operators only: others get the 403 page (the API lets them read, not write)."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("Only operators (staff users) manage Slurm accounts.")
        return view(request, *args, **kwargs)

    return wrapper


def _account_or_404(name: str) -> SlurmAccount:
    account = accounts.account_get(name)
    if account is None:
        raise Http404(f"No account '{name}'.")
    return account


def _initial(account: SlurmAccount) -> dict:
    return {field: getattr(account, field) for field in accounts.WRITABLE}


@staff_required
@require_http_methods(["GET", "POST"])
def account_list(request):
    """The accounts, and the form that creates one (a POST here)."""
    form = AccountForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            account = accounts.account_create(data=form.account_data)
        except accounts.AccountConflict as exc:
            form.add_error("name", str(exc))
        else:
            messages.success(request, f"Account {account.name} created.")
            return redirect("clusters:account_edit", name=account.name)
    rows = SlurmAccount.objects.prefetch_related("members").order_by("name")
    status = 400 if form.errors else 200
    return render(
        request, "clusters/account_list.html", {"accounts": rows, "form": form}, status=status
    )


@staff_required
@require_http_methods(["GET", "POST"])
def account_edit(request, name: str):
    account = _account_or_404(name)
    form = AccountForm(request.POST or None, initial=_initial(account), editing=True)
    if request.method == "POST" and form.is_valid():
        try:
            accounts.account_update(account=account, data=form.account_data)
        except accounts.AccountError as exc:
            for field, message in exc.fields.items():
                form.add_error(field if field in form.fields else None, message)
        except SlurmError as exc:
            account.refresh_from_db()
            form.add_error(None, f"Slurm did not take the change: {exc}")
        else:
            messages.success(request, f"Account {account.name} saved.")
            return redirect("clusters:account_edit", name=account.name)
    return render(
        request,
        "clusters/account_form.html",
        {"form": form, "account": account, "member_form": MemberForm()},
        status=400 if form.errors else 200,
    )


@staff_required
@require_POST
def account_delete(request, name: str):
    account = _account_or_404(name)
    try:
        accounts.account_delete(account=account)
    except (accounts.AccountConflict, SlurmError) as exc:
        messages.error(request, f"Account {account.name} was not deleted: {exc}")
        return redirect("clusters:account_edit", name=account.name)
    messages.success(request, f"Account {name} deleted.")
    return redirect("clusters:account_list")


@staff_required
@require_POST
def account_member_add(request, name: str):
    account = _account_or_404(name)
    member_form = MemberForm(request.POST)
    if member_form.is_valid():
        accounts.account_user_add(account=account, user=member_form.user)
        messages.success(request, f"{member_form.user.username} added to {account.name}.")
        return redirect("clusters:account_edit", name=account.name)
    form = AccountForm(initial=_initial(account), editing=True)
    context = {"form": form, "account": account, "member_form": member_form}
    return render(request, "clusters/account_form.html", context, status=400)


@staff_required
@require_POST
def account_member_remove(request, name: str, username: str):
    account = _account_or_404(name)
    user = accounts.user_get(username)
    if user is None or not account.members.filter(pk=user.pk).exists():
        raise Http404(f"No member '{username}' in {account.name}.")
    posix = getattr(getattr(user, "posix_account", None), "name", None)
    try:
        accounts.account_user_remove(account=account, user=user, posix_name=posix)
    except SlurmError as exc:
        messages.error(request, f"{username} was not removed: {exc}")
    else:
        messages.success(request, f"{username} removed from {account.name}.")
    return redirect("clusters:account_edit", name=account.name)
