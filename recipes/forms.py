"""The recipe launch page's form: one field per recipe parameter (from the catalog's
typed Param list) plus the job's own fields (nodes, partition, GPUs per node, name,
time limit).

Like the submit page's form, it only turns what a browser sends into the launch body;
every rule (the catalog's limits, the Slurm Job API's checks) is applied by
recipe_plan, and its LaunchError.fields come back beside the fields they name."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django import forms

from .catalog import Param, Recipe

# The launch body's job fields; recipe parameters may not use these names.
JOB_FIELDS = ("nodes", "partition", "gpus_per_node", "name", "time_limit", "register_as")


def _limit(value: float | None, kind: str) -> str | None:
    if value is None:
        return None
    return str(int(value)) if kind == "int" else f"{value:g}"


def _shown(value: float | None, kind: str) -> str | None:
    if value is None:
        return None
    return f"{int(value):,}" if kind == "int" else f"{value:g}"


def param_limits(param: Param) -> str:
    """'1 – 10,000,000', '≥ 0', 'tiny, small, …' (the recipes and launch pages)."""
    if param.choices:
        return ", ".join(param.choices)
    low, high = _shown(param.minimum, param.kind), _shown(param.maximum, param.kind)
    if low is not None and high is not None:
        return f"{low} – {high}"
    if low is not None:
        return f"≥ {low}"
    if high is not None:
        return f"≤ {high}"
    return ""


def display_value(value: Any) -> str:
    """A parameter value as people read it: yes/no, 0.003, —."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def param_field(param: Param) -> forms.Field:
    """The form field for one recipe parameter. Limits go to the browser as min/max
    attributes (the form is novalidate); the catalog checks them on the server."""
    common = {"label": param.name.replace("_", " ").capitalize(), "help_text": param.help}
    attrs: dict[str, Any] = {}
    if param.minimum is not None:
        attrs["min"] = _limit(param.minimum, param.kind)
    if param.maximum is not None:
        attrs["max"] = _limit(param.maximum, param.kind)
    # A number whose default is none (a cap) may be left empty: the default.
    optional = {"required": param.required or param.default is not None}
    if param.kind == "int":
        attrs["step"] = "1"
        return forms.IntegerField(widget=forms.NumberInput(attrs=attrs), **common, **optional)
    if param.kind == "float":
        attrs["step"] = "any"
        return forms.FloatField(widget=forms.NumberInput(attrs=attrs), **common, **optional)
    if param.kind == "choice":
        return forms.ChoiceField(choices=[(c, c) for c in param.choices], **common)
    if param.kind == "bool":
        return forms.BooleanField(required=False, **common)
    placeholder = {
        "path": "/absolute/path",
        "checkpoint": "/absolute/path or models/<name>@<ref>",
        "checkpointing": "none, full or every_N",
    }
    placeholder = placeholder.get(param.kind, "")
    return forms.CharField(
        required=param.required,
        max_length=1001,
        widget=forms.TextInput(
            attrs={
                "class": "mono",
                "autocomplete": "off",
                "spellcheck": "false",
                "placeholder": placeholder,
            }
        ),
        **common,
    )


def body_digest(body: dict) -> str:
    """A short fingerprint of a launch body: Launch submits only what the page showed."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class RecipeLaunchForm(forms.Form):
    nodes = forms.IntegerField(
        help_text="One torchrun per node; Slurm picks the nodes.",
        widget=forms.NumberInput(attrs={"min": "1", "step": "1"}),
    )
    partition = forms.ChoiceField(required=False)
    gpus_per_node = forms.IntegerField(
        label="GPUs per node",
        required=False,
        widget=forms.NumberInput(attrs={"min": "0", "step": "1", "placeholder": "none"}),
        help_text="Asked of Slurm per node; with real GPUs, one training process each.",
    )
    name = forms.CharField(
        required=False,
        max_length=128,
        strip=False,  # a trailing newline is an error to show, not to drop
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
        help_text="Shown by squeue; empty for the recipe and model.",
    )
    time_limit = forms.CharField(
        required=False,
        label="Time limit",
        widget=forms.TextInput(attrs={"placeholder": "e.g. 30 or 1:00:00"}),
        help_text="Empty for the partition's.",
    )
    register_as = forms.CharField(
        required=False,
        max_length=64,
        label="Register as",
        widget=forms.TextInput(
            attrs={
                "class": "mono",
                "autocomplete": "off",
                "spellcheck": "false",
                "placeholder": "model name (optional)",
            }
        ),
        help_text="When the job completes, its final checkpoint becomes this model's next "
        "version in the registry (the model is created if new).",
    )

    def __init__(
        self,
        *args,
        recipe: Recipe,
        partitions: list[str],
        default_partition: str = "",
        default_nodes: int = 1,
        max_nodes: int = 0,
        max_gpus: int = 0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.recipe = recipe
        clash = {p.name for p in recipe.params} & set(JOB_FIELDS)
        if clash:  # would need prefixed field names; caught by the tests
            raise ValueError(f"recipe parameters named like job fields: {sorted(clash)}")
        for param in recipe.params:
            self.fields[param.name] = param_field(param)
            if param.default is not None:
                self.initial.setdefault(param.name, param.default)
        self.fields["partition"].choices = [(p, p) for p in partitions]
        if default_partition or partitions:
            self.initial.setdefault("partition", default_partition or partitions[0])
        self.initial.setdefault("nodes", default_nodes)
        if max_nodes:
            self.fields["nodes"].widget.attrs["max"] = str(max_nodes)
        if max_gpus:
            self.fields["gpus_per_node"].widget.attrs["max"] = str(max_gpus)
        self.fields["name"].widget.attrs["placeholder"] = f"{recipe.recipe_id}-<model>"

    # --- the parameters' fields, for the template ------------------------------------
    def param_fields(self) -> list[tuple[forms.BoundField, Param]]:
        return [(self[p.name], p) for p in self.recipe.params]

    # --- the launch body ------------------------------------------------------------
    def clean_name(self):
        return self.cleaned_data["name"].strip(" ")

    def _values(self) -> dict[str, Any]:
        """What parsed: cleaned data once bound, the initial values otherwise."""
        if self.is_bound:
            return getattr(self, "cleaned_data", {})
        return {name: self.initial.get(name) for name in self.fields}

    def launch_body(self) -> dict[str, Any]:
        """The body for recipe_plan/recipe_launch from the fields that parsed: empty
        optional fields are left out, every set recipe parameter is an override."""
        values = self._values()
        body: dict[str, Any] = {}
        for key in JOB_FIELDS:
            value = values.get(key)
            if isinstance(value, str):
                value = value.strip() if key != "name" else value
            if value is None or value == "":
                continue
            body[key] = value
        overrides = {}
        for param in self.recipe.params:
            value = values.get(param.name)
            if isinstance(value, str) and param.kind in ("path", "checkpoint", "str"):
                value = value.strip()
            if value is None or value == "":
                continue
            overrides[param.name] = value
        body["overrides"] = overrides
        return body

    def add_launch_errors(self, fields: dict[str, str]) -> None:
        """LaunchError.fields ("overrides.steps", "nodes", ...) -> errors beside the
        fields (a field that already shows an error keeps just that one); the rest
        (e.g. "recipe", "non_field_errors") at the top of the form."""
        params = {p.name for p in self.recipe.params}
        for key, message in fields.items():
            name = key.removeprefix("overrides.")
            if key.startswith("overrides.") and name in params:
                target = name
            elif key in JOB_FIELDS:
                target = key
            else:
                self.add_error(None, message if key == "non_field_errors" else f"{key}: {message}")
                continue
            if target not in self.errors:
                self.add_error(target, message)
