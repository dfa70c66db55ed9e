from django.urls import path

from . import account_views, create_views, views

app_name = "clusters"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("clusters/", views.cluster_list, name="cluster_list"),
    # create/ comes before <cluster_id>/: "create" is a valid cluster id.
    path("clusters/create/", create_views.create_landing, name="create"),
    path("clusters/create/wizard/", create_views.wizard_start, name="wizard"),
    path("clusters/create/wizard/reset/", create_views.wizard_reset, name="wizard_reset"),
    path("clusters/create/wizard/<slug:step>/", create_views.wizard_step, name="wizard_step"),
    path("clusters/create/reference/", create_views.create_reference, name="create_reference"),
    path(
        "clusters/create/reference/<slug:key>/",
        create_views.create_reference_edit,
        name="create_reference_edit",
    ),
    path("clusters/create/json/", create_views.create_json, name="create_json"),
    path("clusters/<slug:cluster_id>/", views.cluster_detail, name="cluster_detail"),
    path("clusters/<slug:cluster_id>/fragment/", views.cluster_fragment, name="cluster_fragment"),
    path("clusters/<slug:cluster_id>/delete/", views.cluster_delete, name="cluster_delete"),
    path("clusters/<slug:cluster_id>/retry/", views.cluster_retry, name="cluster_retry"),
    path("slurm-accounts/", account_views.account_list, name="account_list"),
    path("slurm-accounts/<str:name>/", account_views.account_edit, name="account_edit"),
    path("slurm-accounts/<str:name>/delete/", account_views.account_delete, name="account_delete"),
    path(
        "slurm-accounts/<str:name>/members/",
        account_views.account_member_add,
        name="account_member_add",
    ),
    path(
        "slurm-accounts/<str:name>/members/<str:username>/remove/",
        account_views.account_member_remove,
        name="account_member_remove",
    ),
]
