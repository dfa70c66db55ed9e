"""Pages of the recipes app: the catalog, a launch form, run comparison, TensorBoard."""

from django.urls import path

from . import compare_views, tensorboard_views, views

app_name = "recipes"

# Included before jobs.urls: .../jobs/<id>/tensorboard/ must win over the job action route.
urlpatterns = [
    path("recipes/", views.recipe_list, name="recipes"),
    path("jobs/compare/", compare_views.job_compare, name="compare"),
    # TensorBoard, proxied: everything under the prefix goes to the cluster's process.
    path(
        "clusters/<slug:cluster_id>/tensorboard/",
        tensorboard_views.tensorboard_proxy,
        name="tensorboard",
    ),
    path(
        "clusters/<slug:cluster_id>/tensorboard/<path:subpath>",
        tensorboard_views.tensorboard_proxy,
        name="tensorboard_path",
    ),
    path(
        "clusters/<slug:cluster_id>/recipes/<slug:recipe>/launch/",
        views.recipe_launch_page,
        name="recipe_launch",
    ),
    path(
        "clusters/<slug:cluster_id>/jobs/<str:job_id>/tensorboard/",
        tensorboard_views.tensorboard_open,
        name="tensorboard_open",
    ),
]
