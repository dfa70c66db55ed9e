from django.urls import re_path

from jobs.api.urls import JOB

from .views import JobMetricsView, RecipeLaunchView, RecipeListView

urlpatterns = [
    re_path(JOB + r"/metrics/?$", JobMetricsView.as_view(), name="job-metrics"),
    re_path(r"^recipes/?$", RecipeListView.as_view(), name="recipe-list"),
    re_path(
        r"^clusters/(?P<cluster_id>[a-z][a-z0-9-]{0,30})/recipes/(?P<recipe>[a-z0-9-]{1,40})"
        r"/launch/?$",
        RecipeLaunchView.as_view(),
        name="recipe-launch",
    ),
]
