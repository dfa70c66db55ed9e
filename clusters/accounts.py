"""Slurm accounts (teams), their members and limits: writes (account_create, ...) and
the reads the API and submit need. Operators' writes go to slurmdbd at once on every
cluster the account is already on; a cluster gets an account, and a user their
association under it, when the first job that needs them is submitted there
(association_ensure), so new clusters and new users need no separate step.

Kept in one module (services and selectors) because both sides are small and share
the validation."""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from mtc.fielderrors import FieldErrors
from slurm import SlurmError
from slurm import accounts as sacctmgr
from slurm.config import cluster_name

from .models import Cluster, SlurmAccount, SlurmAssociation
from .providers import get_provider

LIMIT_FIELDS = ("shares", "qos", "grp_tres", "grp_tres_mins", "max_tres_per_user")
WRITABLE = ("description", *LIMIT_FIELDS)
QOS_LIST_RE = re.compile(rf"{sacctmgr.NAME_RE.pattern}(,{sacctmgr.NAME_RE.pattern})*")


class AccountError(FieldErrors):
    """Bad input (HTTP 400), ``fields`` naming each bad field."""


class AccountConflict(Exception):
    """The account exists already, or still has jobs (HTTP 409)."""


def _limits(account: SlurmAccount) -> sacctmgr.Limits:
    return sacctmgr.Limits(
        shares=account.shares,
        qos=account.qos,
        grp_tres=account.grp_tres,
        grp_tres_mins=account.grp_tres_mins,
        max_tres_per_user=account.max_tres_per_user,
    )


def accounting_enabled(cluster: Cluster) -> bool:
    """A local cluster has associations to manage when mtc runs slurmdbd and the
    cluster's slurm.conf stores accounting there: one made before accounting was turned
    on keeps its config (no slurmdbd to ask) until its next change."""
    if not settings.MTC_SLURMDBD_PORT or cluster.provider != "local":
        return False
    try:
        conf = get_provider(cluster.provider).conf_path(cluster).read_text()
    except OSError:  # no daemons made yet, or none any more
        return False
    return "AccountingStorageType=accounting_storage/slurmdbd" in conf


def _client(cluster: Cluster):
    return get_provider(cluster.provider).slurm(cluster)


def validate(data, *, partial: bool) -> dict:
    """The writable fields of a body, checked; raises AccountError."""
    if not isinstance(data, dict):
        raise AccountError({"non_field_errors": "The body must be a JSON object."})
    errors: dict[str, str] = {}
    allowed = WRITABLE if partial else ("name", *WRITABLE)
    for key in data:
        if key not in allowed:
            errors[str(key)] = "Unknown field." if key != "name" else "Names cannot change."
    clean: dict = {}
    if not partial:
        name = data.get("name")
        if not isinstance(name, str) or not sacctmgr.NAME_RE.fullmatch(name):
            errors["name"] = (
                "Lower-case letters, digits, _ and -, starting with a letter; 40 at most."
            )
        else:
            clean["name"] = name
    if "description" in data:
        text = data["description"]
        if not isinstance(text, str) or len(text) > 200 or any(c in text for c in "\n'\"|"):
            errors["description"] = "One line of text, at most 200 characters, no quotes or |."
        else:
            clean["description"] = text
    if "shares" in data:
        shares = data["shares"]
        if shares is not None and (
            isinstance(shares, bool) or not isinstance(shares, int) or not 1 <= shares <= 1_000_000
        ):
            errors["shares"] = "A whole number from 1 to 1000000 (or null for Slurm's default)."
        else:
            clean["shares"] = shares
    if "qos" in data:
        qos = data["qos"]
        if qos is None:
            qos = ""
        if not isinstance(qos, str) or (qos and not QOS_LIST_RE.fullmatch(qos)):
            errors["qos"] = "Comma-separated QoS names (lower-case letters, digits, _ and -)."
        else:
            clean["qos"] = qos
    for key in ("grp_tres", "grp_tres_mins", "max_tres_per_user"):
        if key in data:
            value = data[key]
            if value is None:
                value = ""
            if not isinstance(value, str) or (value and not sacctmgr.TRES_LIST_RE.fullmatch(value)):
                errors[key] = (
                    "TRES=count pairs, comma-separated, e.g. gres/gpu=16 or cpu=64,gres/gpu=8."
                )
            else:
                clean[key] = value
    if errors:
        raise AccountError(errors)
    return clean


def _clusters_of(name: str):
    ids = SlurmAssociation.objects.filter(account=name, user="").values_list(
        "cluster_id", flat=True
    )
    return Cluster.objects.filter(pk__in=list(ids))


def account_create(*, data) -> SlurmAccount:
    """A new account; it reaches each cluster with its members' first job there."""
    clean = validate(data, partial=False)
    try:
        with transaction.atomic():
            return SlurmAccount.objects.create(**clean)
    except IntegrityError as exc:
        raise AccountConflict(f"Account '{clean['name']}' exists already.") from exc


def account_update(*, account: SlurmAccount, data) -> SlurmAccount:
    """Change the account's limits, in slurmdbd on every cluster it is on. Raises
    AccountError or SlurmError (then nothing is stored)."""
    clean = validate(data, partial=True)
    for key, value in clean.items():
        setattr(account, key, value)
    limits = _limits(account)
    for cluster in _clusters_of(account.name):
        sacctmgr.account_modify(
            _client(cluster),
            cluster=cluster_name(cluster.cluster_id),
            name=account.name,
            limits=limits,
        )
    account.save()
    return account


def account_delete(*, account: SlurmAccount) -> None:
    for cluster in _clusters_of(account.name):
        try:
            sacctmgr.account_delete(
                _client(cluster), cluster=cluster_name(cluster.cluster_id), name=account.name
            )
        except SlurmError as exc:
            if exc.permanent:  # e.g. jobs of the account are still running
                raise AccountConflict(f"Slurm refused to delete '{account.name}': {exc}") from exc
            raise
    SlurmAssociation.objects.filter(account=account.name).delete()
    account.delete()


def account_user_add(*, account: SlurmAccount, user) -> None:
    account.members.add(user)


def account_user_remove(*, account: SlurmAccount, user, posix_name: str | None) -> None:
    """Out of the account, and out of its associations on every cluster."""
    if posix_name:
        rows = SlurmAssociation.objects.filter(account=account.name, user=posix_name)
        for row in rows.select_related("cluster"):
            sacctmgr.user_remove(
                _client(row.cluster),
                cluster=cluster_name(row.cluster.cluster_id),
                user=posix_name,
                account=account.name,
            )
        rows.delete()
    account.members.remove(user)


# --- reads -------------------------------------------------------------------
def accounts_for(*, user) -> list[str]:
    """Names of the accounts a user may submit under, their default first."""
    names = list(user.slurm_accounts.order_by("name").values_list("name", flat=True))
    return names or [settings.MTC_DEFAULT_ACCOUNT]


def account_get(name: str) -> SlurmAccount | None:
    if not sacctmgr.NAME_RE.fullmatch(name):
        return None
    return SlurmAccount.objects.filter(name=name).first()


def user_get(username: str):
    return get_user_model().objects.filter(username=username).first()


# --- what a submit needs -----------------------------------------------------
def account_choose(*, user, account: str) -> str:
    """The account a job of ``user`` goes under: the one asked for if they are in it
    (AccountError naming ``account`` otherwise), else their default."""
    if user is None:
        return account
    mine = accounts_for(user=user)
    if not account:
        return mine[0]
    if account not in mine:
        raise AccountError(
            {"account": f"You are not in account '{account}'; yours: {', '.join(mine)}."}
        )
    return account


def association_ensure(*, cluster: Cluster, account: str, user: str) -> None:
    """The account on the cluster (with its limits) and the user's association under
    it, made in slurmdbd once (Slurm refuses jobs without one when limits are
    enforced). Raises SlurmError."""
    if not accounting_enabled(cluster) or not account:
        return
    have = set(
        SlurmAssociation.objects.filter(
            cluster=cluster, account=account, user__in=["", user]
        ).values_list("user", flat=True)
    )
    if {"", user} <= have:
        return
    record = SlurmAccount.objects.filter(name=account).first()
    limits = _limits(record) if record else sacctmgr.Limits()
    client, name = _client(cluster), cluster_name(cluster.cluster_id)
    if "" not in have:
        sacctmgr.account_add(client, cluster=name, name=account, limits=limits)
        SlurmAssociation.objects.get_or_create(cluster=cluster, account=account, user="")
    if user and user not in have:
        sacctmgr.user_add(client, cluster=name, user=user, account=account, limits=limits)
        SlurmAssociation.objects.get_or_create(cluster=cluster, account=account, user=user)
