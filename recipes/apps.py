from django.apps import AppConfig


class RecipesConfig(AppConfig):
    name = "recipes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from clusters.signals import cluster_deleting
        from jobs import extensions

        from . import tasks  # noqa: F401 (registers the Celery tasks)
        from .tensorboard import tensorboard_stop_on_delete
        from .views import recipe_job_context, recipe_job_series

        cluster_deleting.connect(tensorboard_stop_on_delete, dispatch_uid="recipes-tensorboard")

        if recipe_job_context not in extensions.job_card_parts:
            extensions.job_card_parts.append(recipe_job_context)
            extensions.job_series_parts.append(recipe_job_series)
        if recipe_run_files not in extensions.job_file_parts:
            extensions.job_file_parts.append(recipe_run_files)


def recipe_run_files(job) -> list:
    """A recipe job's run directory (run.json, metrics, checkpoints, TensorBoard files):
    the parent of its checkpoint_dir, removed with the job by the retention purge."""
    from pathlib import Path

    if not job.recipe or not job.checkpoint_dir:
        return []
    run_dir = Path(job.checkpoint_dir).parent
    # Only what recipes.launch.new_run_dir makes (runs/<recipe>-<stamp>), never more.
    return [run_dir] if run_dir.parent.name == "runs" else []
