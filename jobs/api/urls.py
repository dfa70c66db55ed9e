from django.urls import re_path

from .views import JobActionView, JobDetailView, JobListView, JobOutputView, UsageView

CLUSTER = r"^clusters/(?P<cluster_id>[a-z][a-z0-9-]{0,30})/jobs"
# Any job id segment reaches the view, which answers 400 for a malformed one.
JOB = CLUSTER + r"/(?P<job_id>[^/]+)"

urlpatterns = [
    re_path(r"^usage/?$", UsageView.as_view(), name="usage"),
    re_path(CLUSTER + r"/?$", JobListView.as_view(), name="job-list"),
    re_path(JOB + r"/?$", JobDetailView.as_view(), name="job-detail"),
    re_path(JOB + r"/output/?$", JobOutputView.as_view(), name="job-output"),
    *[
        re_path(
            JOB + rf"/{action}/?$", JobActionView.as_view(action_name=action), name=f"job-{action}"
        )
        for action in ("cancel", "requeue", "hold", "release")
    ],
]
