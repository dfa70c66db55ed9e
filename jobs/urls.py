from django.urls import path

from . import usage_views, views

app_name = "jobs"

urlpatterns = [
    path("usage/", usage_views.usage_page, name="usage"),
    path("usage.csv", usage_views.usage_csv, name="usage_csv"),
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
        "clusters/<slug:cluster_id>/jobs/<str:job_id>/<slug:action>/",
        views.job_action,
        name="action",
    ),
]
