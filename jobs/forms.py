"""The submit page's form. It only turns what a browser sends into the submission
dict (numbers, a checkbox, KEY=value lines); every rule about a job is checked by
the one validator the API uses too (services.job_validate -> validate_submission)."""

from __future__ import annotations

from django import forms

from slurm.submit import FIELDS, SubmissionError

EXAMPLE_SCRIPT = """#!/bin/bash
# One task on each node: every node says hello.
srun bash -c 'echo "hello from $SLURMD_NODENAME"'
"""
EXAMPLES = (
    ("hello", "Hello from every node", EXAMPLE_SCRIPT),
    (
        "gpus",
        "Show GPUs per node",
        "#!/bin/bash\n"
        "# The GPUs Slurm gave each task (emulated on local clusters).\n"
        "srun bash -c 'echo \"$SLURMD_NODENAME: GPUs ${CUDA_VISIBLE_DEVICES:-none}\"'\n",
    ),
    (
        "sleep",
        "Sleep for two minutes",
        "#!/bin/bash\n"
        "# Handy for trying cancel, hold and requeue.\n"
        'echo "started on $SLURMD_NODENAME"\n'
        "sleep 120\n"
        'echo "done"\n',
    ),
)

# Form fields, in the order the submission's error keys map onto them.
FIELD_NAMES = FIELDS


def parse_env(text: str) -> tuple[dict[str, str], list[str]]:
    """KEY=value lines (blank lines and # comments skipped) -> (env, problems)."""
    env: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"Line {number}: use KEY=value.")
        elif key in env:
            problems.append(f"Line {number}: {key} is set twice.")
        else:
            env[key] = value.strip()
    return env, problems


class JobSubmitForm(forms.Form):
    name = forms.CharField(
        max_length=128,
        strip=False,  # a trailing newline is an error to show, not to drop
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
        help_text="Shown by squeue; at most 128 characters.",
    )
    script = forms.CharField(
        strip=False,
        widget=forms.Textarea(
            attrs={"class": "mono script-editor", "rows": 16, "spellcheck": "false"}
        ),
        help_text="Sent to sbatch as the batch script; it must start with #! "
        "and may carry its own #SBATCH lines.",
    )
    partition = forms.ChoiceField(required=False)
    nodes = forms.IntegerField(min_value=1, initial=1)
    ntasks_per_node = forms.IntegerField(label="Tasks per node", min_value=1, initial=1)
    gpus_per_node = forms.IntegerField(label="GPUs per node", min_value=0, initial=0)
    cpus_per_task = forms.IntegerField(label="CPUs per task", min_value=1, initial=1)
    time_limit = forms.CharField(
        required=False,
        label="Time limit",
        widget=forms.TextInput(attrs={"placeholder": "e.g. 30 or 1:00:00 or 1-00"}),
        help_text="Minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]; empty for the partition's.",
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        strip=False,
        widget=forms.Textarea(
            attrs={
                "class": "mono",
                "rows": 3,
                "spellcheck": "false",
                "placeholder": "KEY=value, one per line",
            }
        ),
        help_text="Exported to the job; one KEY=value per line.",
    )
    requeue = forms.BooleanField(
        required=False,
        initial=True,
        label="Requeue if a node fails",
        help_text="Slurm puts the job back in the queue when a node it runs on fails.",
    )
    dependency = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "e.g. afterok:123"}),
        help_text="Start after other jobs, in Slurm's form.",
    )
    array = forms.CharField(
        required=False,
        label="Array",
        widget=forms.TextInput(attrs={"placeholder": "e.g. 0-15%4"}),
        help_text="Run as an array of tasks.",
    )
    account = forms.CharField(
        required=False,
        label="Account",
        widget=forms.TextInput(attrs={"placeholder": "your default account"}),
        help_text="The Slurm account (team) it is charged to; one of yours.",
    )
    qos = forms.CharField(required=False, label="QoS", help_text="A QoS of the account.")

    def __init__(self, *args, partitions: list[str], default_partition: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        label = f"Default ({default_partition})" if default_partition else "Default"
        self.fields["partition"].choices = [("", label), *((p, p) for p in partitions)]
        if not self.is_bound:
            self.initial.setdefault("script", EXAMPLE_SCRIPT)

    def clean_name(self):
        return self.cleaned_data["name"].strip(" ")

    def clean_script(self):
        # Browsers send a textarea's lines with CRLF; bash wants LF.
        script = self.cleaned_data["script"].replace("\r\n", "\n").replace("\r", "\n")
        return script if script.endswith("\n") else script + "\n"

    def clean_env(self):
        env, problems = parse_env(self.cleaned_data["env"])
        if problems:
            raise forms.ValidationError(problems)
        return env

    def submission_data(self) -> dict:
        """The submission dict from the fields that parsed (validate_submission checks it)."""
        cleaned = getattr(self, "cleaned_data", {})
        data = {}
        for key in FIELD_NAMES:
            if key not in cleaned:
                continue
            value = cleaned[key]
            if key in ("time_limit", "dependency", "array", "partition", "account", "qos"):
                value = value.strip()
                if not value:
                    continue
            data[key] = value
        return data

    def add_submission_errors(self, exc: SubmissionError) -> None:
        """SubmissionError.fields ("name", "env.X", ...) -> errors beside the fields
        (a field that already shows an error keeps just that one)."""
        grouped: dict[str, list[str]] = {}
        for key, message in exc.fields.items():
            field, _, sub = key.partition(".")
            if field in self.fields:
                grouped.setdefault(field, []).append(f"{sub}: {message}" if sub else message)
            elif field == "non_field_errors":
                self.add_error(None, message)
            else:
                self.add_error(None, f"{key}: {message}")
        for field, messages in grouped.items():
            if field not in self.errors:
                self.add_error(field, messages)
