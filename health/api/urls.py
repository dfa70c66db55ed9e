from django.urls import re_path

from .views import (
    AgentReportView,
    FabricCheckView,
    NodeFaultsView,
    NodeHealthView,
    NodeRepairView,
    RepairApproveView,
    RepairListView,
)

NODE = r"^clusters/(?P<cluster_id>[a-z][a-z0-9-]{0,30})/nodes/(?P<node>[a-z][a-z0-9-]{0,79})"

urlpatterns = [
    re_path(
        r"^clusters/(?P<cluster_id>[a-z][a-z0-9-]{0,30})/fabric-check/?$",
        FabricCheckView.as_view(),
        name="cluster-fabric-check",
    ),
    re_path(NODE + r"/health/?$", NodeHealthView.as_view(), name="node-health"),
    re_path(NODE + r"/health/report/?$", AgentReportView.as_view(), name="node-health-report"),
    re_path(NODE + r"/faults/?$", NodeFaultsView.as_view(), name="node-faults"),
    re_path(NODE + r"/repair/?$", NodeRepairView.as_view(), name="node-repair"),
    re_path(r"^repairs/?$", RepairListView.as_view(), name="repair-list"),
    re_path(
        r"^repairs/(?P<repair_id>[0-9]+)/approve/?$",
        RepairApproveView.as_view(),
        name="repair-approve",
    ),
]
