"""The deploy form. Its fields are the API's; serving.deploy checks both the same way."""

from __future__ import annotations

from django import forms

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster
from registry.models import Model, VersionState

from .deploy import DeployError


class EndpointDeployForm(forms.Form):
    model = forms.ChoiceField(label="Model")
    version = forms.CharField(
        label="Version",
        max_length=32,
        help_text="A version number, or an alias such as prod",
        widget=forms.TextInput(attrs={"list": "version-options", "autocomplete": "off"}),
    )
    cluster = forms.ChoiceField(label="Cluster")
    name = forms.CharField(
        label="Name", required=False, max_length=63, help_text="Default: <model>-<version>"
    )
    min_replicas = forms.IntegerField(label="Min replicas", initial=1, min_value=1)
    max_replicas = forms.IntegerField(label="Max replicas", initial=2, min_value=1)
    target_rps_per_replica = forms.FloatField(
        label="Requests/s per replica",
        initial=4.0,
        help_text="The autoscaler adds a replica for each this many requests per second",
    )
    cpus_per_replica = forms.IntegerField(label="CPUs per replica", initial=1, min_value=1)
    gpus_per_replica = forms.IntegerField(label="GPUs per replica", initial=0, min_value=0)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        models = Model.objects.filter(versions__state=VersionState.READY).distinct()
        self.fields["model"].choices = [(m.name, m.name) for m in models]
        clusters = Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES).only("cluster_id")
        self.fields["cluster"].choices = [(c.cluster_id, c.cluster_id) for c in clusters]

    def deploy_data(self) -> dict:
        """What the API would get: the raw posted values (serving.deploy checks them)."""
        keys = [name for name in self.fields if self.data.get(name, "") != ""]
        return {name: self.data.get(name) for name in keys}

    def add_deploy_errors(self, exc: DeployError) -> None:
        for key, message in exc.fields.items():
            self.add_error(key if key in self.fields else None, message)
