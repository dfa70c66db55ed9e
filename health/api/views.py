"""Node health in the API: health, faults, repairs, and agents' reports."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.api.serializers import OperationSerializer
from clusters.models import Node
from clusters.services import node_token_valid
from mtc.api.errors import ApiError
from mtc.api.schema import ErrorSerializer, errors

from .. import services
from ..faults import FaultError, fault_clear, fault_inject
from ..models import HealthReport, NodeFailure, Repair
from ..policy import mode_for
from ..report_schema import MAX_BODY_BYTES, ReportInvalid, body_parse, report_validate
from .serializers import (
    FaultClearedSerializer,
    FaultInjectedSerializer,
    FaultRequestSerializer,
    NodeHealthSerializer,
    RepairListSerializer,
    RepairRequestSerializer,
    RepairSerializer,
    ReportAnswerSerializer,
)


def _node(cluster_id: str, node_name: str) -> Node:
    return get_object_or_404(
        Node.objects.select_related("cluster", "pool"),
        cluster__cluster_id=cluster_id,
        name=node_name,
    )


def repair_data(repair: Repair) -> dict:
    return {
        "id": repair.pk,
        "node": repair.node.name,
        "action": repair.action,
        "state": repair.state,
        "attempt": repair.attempt,
        "message": repair.message,
        "mode": repair.failure.mode if repair.failure else None,
        "operation": str(repair.operation_id) if repair.operation_id else None,
        "jobs_requeued": repair.jobs_requeued,
        "spare_node": repair.spare_node.name if repair.spare_node_id else None,
        "requested_by": repair.requested_by.username if repair.requested_by else None,
        "approved_by": repair.approved_by.username if repair.approved_by else None,
        "create_time": repair.create_time,
        "start_time": repair.start_time,
        "end_time": repair.end_time,
    }


class NodeHealthView(APIView):
    @extend_schema(operation_id="health_retrieve", responses={200: NodeHealthSerializer})
    def get(self, request, cluster_id, node):
        node = _node(cluster_id, node)
        report = HealthReport.objects.filter(node=node, source="agent").first()
        failures = NodeFailure.objects.filter(node=node)[:50]
        repairs = Repair.objects.filter(node=node).select_related(
            "failure", "requested_by", "approved_by", "node", "spare_node"
        )[:50]
        return Response(
            {
                "node": node.name,
                "health": node.health,
                "message": node.health_message,
                "slurm_state": node.slurm_state,
                "last_report_time": node.last_report_time,
                "checks": report.checks if report else [],
                "failures": [
                    {
                        "mode": f.mode,
                        "severity": f.severity,
                        "state": f.state,
                        "meaning": mode_for(f.mode).meaning,
                        "message": f.message,
                        "first_seen": f.first_seen,
                        "last_seen": f.last_seen,
                        "repair_attempts": f.repair_attempts,
                        "confirmed_by": f.confirmed_by,
                        "resolved_time": f.resolved_time,
                    }
                    for f in failures
                ],
                "repairs": [repair_data(r) for r in repairs],
            }
        )


class NodeFaultsView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="health_fault_inject",
        request=FaultRequestSerializer,
        responses={202: FaultInjectedSerializer},
        description='Operators only. Inject a fault: {"kind": "kill"|"disk"|"slow"|"straggle"|'
        '"hang"|"ecc"|"xid"|"dcgm"|"sdc"|"gpu-missing"|"fabric", ...kind parameters}.',
    )
    def post(self, request, cluster_id, node):
        node = _node(cluster_id, node)
        body = request.data if isinstance(request.data, dict) else {}
        kind = body.get("kind")
        params = {k: v for k, v in body.items() if k != "kind"}
        try:
            result = fault_inject(node=node, kind=str(kind), params=params)
        except (FaultError, TypeError, ValueError) as exc:
            raise ApiError(
                code="INVALID_ARGUMENT", message=str(exc), fields={"kind": str(exc)}
            ) from exc
        return Response(result, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="health_fault_clear",
        parameters=[OpenApiParameter("kind", str, description="One kind; default: all")],
        responses={202: FaultClearedSerializer},
        description="Operators only. Clear injected faults.",
    )
    def delete(self, request, cluster_id, node):
        node = _node(cluster_id, node)
        try:
            result = fault_clear(node=node, kind=request.query_params.get("kind"))
        except FaultError as exc:
            raise ApiError(
                code="INVALID_ARGUMENT", message=str(exc), fields={"kind": str(exc)}
            ) from exc
        return Response(result, status=status.HTTP_202_ACCEPTED)


class NodeRepairView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="repairs_request",
        request=RepairRequestSerializer,
        responses={202: OperationSerializer, **errors(409, 503)},
        description="Operators only. Repair a node; the Operation tracks it.",
    )
    def post(self, request, cluster_id, node):
        node = _node(cluster_id, node)
        action = request.data.get("action") if isinstance(request.data, dict) else None
        if action not in ("reboot", "reimage", "replace"):
            raise ApiError(
                code="INVALID_ARGUMENT",
                message="action must be reboot, reimage or replace.",
                fields={"action": "Must be reboot, reimage or replace."},
            )
        try:
            repair = services.repair_request(node=node, action=action, requested_by=request.user)
        except services.RepairConflict as exc:
            raise ApiError(
                code="FAILED_PRECONDITION", message=str(exc), status_code=status.HTTP_409_CONFLICT
            ) from exc
        return Response(OperationSerializer(repair.operation).data, status=status.HTTP_202_ACCEPTED)


class FabricCheckView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="fabric_check_request",
        request=None,
        responses={202: OperationSerializer, **errors(409, 503)},
        description="Operators only. Run the fabric check on the cluster's idle nodes: "
        "all-reduce bus bandwidth over node pairs, in two passes. A node in failing pairs "
        "in both passes gets FABRIC_DEGRADED; the Operation tracks the check.",
    )
    def post(self, request, cluster_id):
        from clusters.models import Cluster
        from mtc.queue import queue_require

        from ..fabric import FabricCheckConflict, fabric_check_request

        cluster = get_object_or_404(Cluster, cluster_id=cluster_id)
        queue_require()
        try:
            operation = fabric_check_request(cluster=cluster, requested_by=request.user)
        except FabricCheckConflict as exc:
            raise ApiError(
                code="FAILED_PRECONDITION", message=str(exc), status_code=status.HTTP_409_CONFLICT
            ) from exc
        return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


class RepairApproveView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="repairs_approve",
        request=None,
        responses={202: RepairSerializer, **errors(409, 503)},
        description="Operators only. Approve a repair that waits for approval.",
    )
    def post(self, request, repair_id):
        repair = get_object_or_404(
            Repair.objects.select_related(
                "node", "cluster", "failure", "requested_by", "approved_by", "spare_node"
            ),
            pk=repair_id,
        )
        try:
            repair = services.repair_approve(repair=repair, approved_by=request.user)
        except services.RepairConflict as exc:
            raise ApiError(
                code="FAILED_PRECONDITION", message=str(exc), status_code=status.HTTP_409_CONFLICT
            ) from exc
        return Response(repair_data(repair), status=status.HTTP_202_ACCEPTED)


class RepairListView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="repairs_list",
        parameters=[
            OpenApiParameter("cluster", str, description="A cluster_id"),
            OpenApiParameter("state", str),
        ],
        responses={200: RepairListSerializer},
        description="Operators only. The latest 200 repairs.",
    )
    def get(self, request):
        qs = Repair.objects.select_related(
            "node", "failure", "requested_by", "approved_by", "spare_node"
        )
        if request.query_params.get("cluster"):
            qs = qs.filter(cluster__cluster_id=request.query_params["cluster"])
        if request.query_params.get("state"):
            qs = qs.filter(state=request.query_params["state"])
        results = [repair_data(r) for r in qs[:200]]
        return Response({"count": len(results), "results": results})


class AgentReportView(APIView):
    """A node agent's report, authenticated by the node's own token (not a user)."""

    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="health_report",
        request={"application/json": {"type": "object", "description": "node/report.py's"}},
        responses={
            202: ReportAnswerSerializer,
            200: ReportAnswerSerializer,
            401: OpenApiResponse(ErrorSerializer, description="Not the node's token"),
            **errors(400, 404, 413, 415),
        },
        description="202: stored (``next_round`` may ask for a deeper DCGM round); 200: a "
        "report no newer than the node's last (already stored), not stored again; 400: the "
        "report is not what the agent sends (``fields`` names each bad JSON path), nothing "
        "stored; 401: not the node's token; 413: larger than 256 KiB.",
    )
    def post(self, request, cluster_id, node):
        # The pool comes along (its kept median speed); the cluster row is not needed.
        node = get_object_or_404(
            Node.objects.select_related("pool"), cluster__cluster_id=cluster_id, name=node
        )
        try:
            size = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            size = 0
        if size > MAX_BODY_BYTES:  # refused before the body is read
            raise ApiError(
                code="INVALID_ARGUMENT",
                message=f"A report is at most {MAX_BODY_BYTES} bytes.",
                fields={"body": f"Larger than {MAX_BODY_BYTES} bytes."},
                status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if not token or not node_token_valid(node, token):
            raise ApiError(
                code="UNAUTHENTICATED",
                message="A valid node token is required.",
                status_code=status.HTTP_401_UNAUTHORIZED,
            )
        try:
            report = report_validate(body_parse(request.body), node=node.name)
        except ReportInvalid as exc:
            raise ApiError(code="INVALID_ARGUMENT", message=str(exc), fields=exc.fields) from exc
        report = services.agent_report_accept(node=node, report=report)
        if report is None:
            # Already stored (the poller read the same report from the node's health.json
            # first), or older than the node's last: accepted, nothing to do.
            return Response({"accepted": False, "reason": "not newer than the node's last report"})
        answer = {
            "accepted": True,
            "ok": report.ok,
            "findings": [f["code"] for f in report.findings],
        }
        deeper = services.deep_check_request(node=node, report=report)
        if deeper:
            answer["next_round"] = deeper
        return Response(answer, status=status.HTTP_202_ACCEPTED)
