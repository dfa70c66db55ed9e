"""Reads on the registry: lists for the pages and the API, version references
(``models/<name>@<alias|number>``), lineage."""

from __future__ import annotations

from django.db.models import Count, Max, Prefetch, QuerySet

from .models import Model, ModelAlias, ModelVersion
from .names import NAME_HELP, REF_HELP, model_name_valid, model_ref_parse

VERSION_RELATED = ("model", "parent__model", "source_job__cluster", "cluster", "created_by")
MAX_LINEAGE = 100  # parents followed before giving up (a cycle cannot be made, but be safe)


class VersionRefError(Exception):
    """A ``models/<name>@<ref>`` that names no version (the message says why)."""


def model_can_write(user, model: Model) -> bool:
    """Owners and operators change a model; everyone signed in reads the registry."""
    return bool(user and (user.is_staff or (model.owner_id and model.owner_id == user.pk)))


def register_as_problem(name: str, user) -> str | None:
    """Why ``user`` may not register versions under ``name`` (the launch's check)."""
    if not model_name_valid(name):
        return NAME_HELP
    model = Model.objects.filter(name=name).first()
    if model is not None and user is not None and not model_can_write(user, model):
        return f"Model '{name}' belongs to another user."
    return None


def models_for_list(*, query: str = "") -> QuerySet[Model]:
    qs = (
        Model.objects.select_related("owner")
        .annotate(
            version_count=Count("versions", distinct=True),
            latest_number=Max("versions__number"),
        )
        .order_by("name")
    )  # an aggregate drops Meta.ordering
    if query:
        qs = qs.filter(name__icontains=query)
    return qs.prefetch_related(
        Prefetch("aliases", queryset=ModelAlias.objects.select_related("version"))
    )


def versions_of(model: Model) -> QuerySet[ModelVersion]:
    """The model's versions with what their serializer and page show (no query per row)."""
    return (
        ModelVersion.objects.filter(model=model)
        .select_related(*VERSION_RELATED)
        .prefetch_related(
            "aliases",
            Prefetch("children", queryset=ModelVersion.objects.select_related("model")),
        )
    )


def version_by_ref(model: Model, ref: str | int) -> ModelVersion | None:
    """A version by number (3) or alias ("production")."""
    qs = ModelVersion.objects.select_related(*VERSION_RELATED)
    if isinstance(ref, int):
        return qs.filter(model=model, number=ref).first()
    return qs.filter(model=model, aliases__alias=ref).first()


def version_resolve(value: str) -> ModelVersion:
    """``models/<name>@<alias|number>`` → the version; raises VersionRefError."""
    parsed = model_ref_parse(value)
    if parsed is None:
        raise VersionRefError(f"A registered version is named {REF_HELP}")
    name, ref = parsed
    model = Model.objects.filter(name=name).first()
    if model is None:
        raise VersionRefError(f"No model '{name}' in the registry.")
    version = version_by_ref(model, ref)
    if version is None:
        what = f"version {ref}" if isinstance(ref, int) else f"alias '{ref}'"
        raise VersionRefError(f"Model '{name}' has no {what}.")
    return version


def version_ancestors(version: ModelVersion) -> list[ModelVersion]:
    """Its parents, oldest first (they may belong to other models)."""
    chain: list[ModelVersion] = []
    seen = {version.pk}
    parent_id = version.parent_id
    while parent_id and parent_id not in seen and len(chain) < MAX_LINEAGE:
        parent = ModelVersion.objects.select_related("model").filter(pk=parent_id).first()
        if parent is None:
            break
        chain.append(parent)
        seen.add(parent.pk)
        parent_id = parent.parent_id
    return list(reversed(chain))


def model_lineage(versions: list[ModelVersion]) -> list[list[ModelVersion]]:
    """The model's chains parent → child: one per version no other version of this
    model started from, each from its oldest known ancestor (possibly in another model)."""
    ids = {v.pk for v in versions}
    parents_here = {v.parent_id for v in versions if v.parent_id in ids}
    by_id = {v.pk: v for v in versions}
    chains = []
    for tip in sorted((v for v in versions if v.pk not in parents_here), key=lambda v: v.number):
        chain = [tip]
        while chain[0].parent_id in by_id and len(chain) < MAX_LINEAGE:
            chain.insert(0, by_id[chain[0].parent_id])
        if chain[0].parent_id:  # it started from another model's version
            chain = version_ancestors(chain[0]) + chain
        chains.append(chain)
    return chains
