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
