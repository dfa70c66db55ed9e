from django.urls import re_path
from rest_framework.routers import SimpleRouter

from .views import ClusterViewSet, NodeViewSet, OperationViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # documented paths have no trailing slash; accept both
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("operations", OperationViewSet, basename="operation")

urlpatterns = [
    re_path(
        r"^clusters/(?P<cluster_id>[a-z][a-z0-9-]{0,30})/nodes/?$",
        NodeViewSet.as_view({"get": "list"}),
        name="cluster-nodes",
    ),
    *router.urls,
]
