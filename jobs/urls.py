from django.urls import path

from . import compare_views, recipe_views, tensorboard_views, views

app_name = "jobs"

urlpatterns = [
    path("recipes/", recipe_views.recipe_list, name="recipes"),
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
        recipe_views.recipe_launch_page,
        name="recipe_launch",
    ),
    path("clusters/<slug:cluster_id>/jobs/", views.job_queue, name="queue"),
    # fragment/ and submit/ come before <job_id>/ (which only takes 123 or 123_4).
    path(
        "clusters/<slug:cluster_id>/jobs/fragment/",
        views.job_queue_fragment,
        name="queue_fragment",
    ),
    path("clusters/<slug:cluster_id>/jobs/submit/", views.job_submit, name="submit"),
    path("clusters/<slug:cluster_id>/jobs/<str:job_id>/", views.job_detail, name="detail"),
    path(
        "clusters/<slug:cluster_id>/jobs/<str:job_id>/fragment/",
        views.job_detail_fragment,
        name="detail_fragment",
    ),
    path(
        "clusters/<slug:cluster_id>/jobs/<str:job_id>/tensorboard/",
        tensorboard_views.tensorboard_open,
        name="tensorboard_open",
    ),
    path(
        "clusters/<slug:cluster_id>/jobs/<str:job_id>/<slug:action>/",
        views.job_action,
        name="action",
    ),
]
