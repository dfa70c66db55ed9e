from django.urls import path

from . import views

app_name = "health"

urlpatterns = [
    path("repairs/", views.repair_queue, name="repairs"),
    path("repairs/<int:repair_id>/approve/", views.repair_approve, name="repair_approve"),
    path(
        "clusters/<slug:cluster_id>/nodes/<str:node_name>/",
        views.node_detail,
        name="node",
    ),
    path(
        "clusters/<slug:cluster_id>/nodes/<str:node_name>/repair/",
        views.node_repair,
        name="node_repair",
    ),
]
