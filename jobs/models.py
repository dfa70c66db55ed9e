from pathlib import Path

from django.conf import settings
from django.db import models

from clusters.models import Cluster

from .choices import ACTIVE_STATES, JobState

# The rows still waiting for their final record, as `settled IN (false)`, not Django's
# `NOT settled`: an equality on the (cluster, settled) index's second column, which
# SQLite's planner picks with or without ANALYZE's statistics (`NOT settled` matches no
# index column, and the planner then walked the cluster's whole history).
UNSETTLED = models.Q(settled__in=[False])


class Job(models.Model):
    """A Slurm job as the poller last saw it, plus what mtc knows about it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="jobs")
    job_id = models.CharField(max_length=32, help_text="Slurm's id: 123, or 123_4 for a task")
    job_number = models.PositiveBigIntegerField(help_text="123 for both 123 and 123_4")
    array_task_id = models.IntegerField(null=True, blank=True)
    name = models.CharField(max_length=200)
    user = models.CharField(max_length=64, help_text="The Slurm (Unix) user")
    partition = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    reason = models.CharField(max_length=200, blank=True)
    nodes = models.PositiveIntegerField(default=1)
    node_list = models.CharField(max_length=500, blank=True)
    cpus = models.PositiveIntegerField(default=1)
    gpus_per_node = models.PositiveIntegerField(default=0)
    time_limit = models.CharField(max_length=32, blank=True)
    submit_time = models.DateTimeField(null=True, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    # When Slurm expects a pending job to start (squeue's StartTime while pending);
    # null when it has no plan, and once the job is no longer pending.
    expected_start_time = models.DateTimeField(null=True, blank=True)
    exit_code = models.CharField(max_length=16, blank=True, help_text="exit:signal, as Slurm")
    requeue_count = models.PositiveIntegerField(default=0)
    # From accounting (sacct), once the job has left the queue; null: not recorded.
    elapsed_s = models.PositiveIntegerField(null=True, blank=True, help_text="Run time, s")
    cpu_time_s = models.FloatField(null=True, blank=True, help_text="CPU time used, s")
    max_rss_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Largest resident memory of any step"
    )
    gpus_allocated = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs allocated (gres/gpu TRES)"
    )
    cpus_allocated = models.PositiveIntegerField(
        null=True, blank=True, help_text="CPUs allocated (cpu TRES)"
    )
    mem_allocated_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Memory allocated (mem TRES), bytes"
    )
    account = models.CharField(max_length=64, blank=True, help_text="Slurm account (sacct)")
    # The poller reads only unsettled rows besides the queue: a row settles once its
    # final record is stored (from sacct, or as it stands when there is no accounting).
    settled = models.BooleanField(default=False)
    gone_time = models.DateTimeField(
        null=True, blank=True, help_text="When the poller first missed it from the queue"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
    )
    submitted_by_mtc = models.BooleanField(default=False)
    script = models.TextField(blank=True)
    options = models.JSONField(default=dict, blank=True)
    recipe = models.CharField(max_length=64, blank=True)
    register_as = models.CharField(
        max_length=63, blank=True, help_text="Model to register the final checkpoint under"
    )
    parameters = models.JSONField(default=dict, blank=True)
    checkpoint_dir = models.CharField(max_length=500, blank=True)
    metrics = models.JSONField(default=dict, blank=True, help_text="Latest figures (summary)")
    metrics_offset = models.PositiveBigIntegerField(
        default=0, help_text="Bytes of the run's metrics.jsonl already stored"
    )
    update_time = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-job_number", "array_task_id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "job_id"], name="job_id_unique_per_cluster")
        ]
        indexes = [
            models.Index(fields=["cluster", "-job_number", "array_task_id"]),
            models.Index(fields=["cluster", "state"]),
            # The poller's round: the rows still waiting for their final record (UNSETTLED).
            models.Index(fields=["cluster", "settled"], name="job_settled"),
            # A user's own jobs, newest first: a page of them without walking everyone
            # else's (tests/test_query_plans.py). Owner first, so that a list of all the
            # cluster's jobs (an operator's) never takes it for its cluster prefix.
            models.Index(
                fields=["owner", "cluster", "-job_number", "array_task_id"],
                name="job_owner_newest",
            ),
            # The retention purge: finished jobs by their end, across clusters.
            models.Index(fields=["state", "end_time"]),
            # Usage: a cluster's finished jobs by their end (jobs.usage).
            models.Index(fields=["cluster", "end_time"], name="job_usage_end"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.job_id}"

    @property
    def metrics_path(self) -> Path | None:
        """A recipe job's metrics file: beside its checkpoints, in the run directory."""
        if not self.checkpoint_dir:
            return None
        return Path(self.checkpoint_dir).parent / "metrics.jsonl"

    @property
    def is_active(self) -> bool:
        """Queued or running: not yet in a final state."""
        return self.state in ACTIVE_STATES

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def efficiency(self) -> dict | None:
        """What seff prints, once accounting has the job's record (jobs.efficiency)."""
        from .efficiency import job_efficiency

        return job_efficiency(
            elapsed_s=self.elapsed_s,
            cpu_time_s=self.cpu_time_s,
            cpus=self.cpus_allocated or self.cpus,
            max_rss_bytes=self.max_rss_bytes,
            mem_bytes=self.mem_allocated_bytes,
            gpus=self.gpus_allocated,
        )


class JobEvent(models.Model):
    """One change in a job's life: state changes, requests, interruptions (in order)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField()
    state = models.CharField(max_length=16, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    cause = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["time", "id"]
        indexes = [models.Index(fields=["job", "time"])]


class JobMetric(models.Model):
    """One training step's figures, read from the run's metrics.jsonl by the poller."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    time = models.DateTimeField(null=True, blank=True)
    values = models.JSONField(default=dict)

    class Meta:
        ordering = ["job", "step", "id"]
        indexes = [models.Index(fields=["job", "step"])]


class JobHang(models.Model):
    """A recipe job found hung: no new step for longer than its threshold
    (recipes/hang.py). One row per (job, attempt, step): a poller that finds the same hang
    twice inserts it once, and only the inserter requeues the job."""

    DETECTED, REQUEUED, NOT_REQUEUED = "detected", "requeued", "not-requeued"
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="hangs")
    attempt = models.PositiveIntegerField(help_text="The job's requeue count when it hung")
    step = models.PositiveIntegerField(help_text="The last step it finished")
    since = models.DateTimeField(help_text="Its last progress (step or metrics line)")
    detected_time = models.DateTimeField()
    threshold_s = models.FloatField()
    rank = models.IntegerField(null=True, blank=True, help_text="The rank named as the cause")
    node = models.CharField(max_length=80, blank=True)
    why = models.CharField(max_length=300, blank=True)
    stacks = models.TextField(blank=True, help_text="Every rank's fresh stacks")
    excerpt = models.TextField(blank=True, help_text="The named rank's stack, or why none")
    state = models.CharField(max_length=16, default=DETECTED)
    node_marked = models.BooleanField(
        default=False, help_text="The node's JOB_HANG failure is open (once the job left it)"
    )

    class Meta:
        ordering = ["detected_time", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "step"], name="job_hang_once")
        ]
