from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import ClusterViewSet, NodeViewSet, OperationViewSet

router = SimpleRouter(trailing_slash="/?")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("operations", OperationViewSet, basename="operation")

urlpatterns = [
    path(
        "clusters/<str:cluster_id>/nodes",
        NodeViewSet.as_view({"get": "list"}),
        name="cluster-nodes",
    ),
    *router.urls,
]
