from django.urls import re_path
from rest_framework.routers import SimpleRouter

from .accounts import AccountDetailView, AccountListView, AccountUserView
from .views import ClusterViewSet, NodeViewSet, OperationViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # documented paths have no trailing slash; accept both
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("operations", OperationViewSet, basename="operation")

ACCOUNT = r"(?P<name>[a-z][a-z0-9_-]{0,39})"
urlpatterns = [
    re_path(r"^accounts/?$", AccountListView.as_view(), name="accounts"),
    re_path(rf"^accounts/{ACCOUNT}/?$", AccountDetailView.as_view(), name="account"),
    re_path(
        rf"^accounts/{ACCOUNT}/users/(?P<username>[\w.@+-]{{1,150}})/?$",
        AccountUserView.as_view(),
        name="account-user",
    ),
    re_path(
        r"^clusters/(?P<cluster_id>[a-z][a-z0-9-]{0,30})/nodes/?$",
        NodeViewSet.as_view({"get": "list"}),
        name="cluster-nodes",
    ),
    *router.urls,
]
