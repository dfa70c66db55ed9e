"""Health API bodies, for the schema: the views build these dicts directly."""

from __future__ import annotations

from rest_framework import serializers


class FailureSerializer(serializers.Serializer):
    mode = serializers.CharField()
    severity = serializers.CharField()
    state = serializers.CharField()
    meaning = serializers.CharField()
    message = serializers.CharField()
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    repair_attempts = serializers.IntegerField()
    confirmed_by = serializers.CharField()
    resolved_time = serializers.DateTimeField(allow_null=True)


class RepairSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    node = serializers.CharField()
    action = serializers.CharField(help_text="reboot, reimage or replace")
    state = serializers.CharField()
    attempt = serializers.IntegerField()
    message = serializers.CharField()
    mode = serializers.CharField(allow_null=True, help_text="The failure mode it repairs")
    operation = serializers.CharField(allow_null=True, help_text="Its Operation's id")
    jobs_requeued = serializers.IntegerField()
    spare_node = serializers.CharField(
        allow_null=True, help_text="The spare of the pool that took the node's place"
    )
    requested_by = serializers.CharField(allow_null=True)
    approved_by = serializers.CharField(allow_null=True)
    create_time = serializers.DateTimeField()
    start_time = serializers.DateTimeField(allow_null=True)
    end_time = serializers.DateTimeField(allow_null=True)


class RepairListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    results = RepairSerializer(many=True)


class NodeHealthSerializer(serializers.Serializer):
    node = serializers.CharField()
    health = serializers.CharField()
    message = serializers.CharField()
    slurm_state = serializers.CharField()
    last_report_time = serializers.DateTimeField(allow_null=True)
    checks = serializers.ListField(child=serializers.DictField(), help_text="The agent's last")
    failures = FailureSerializer(many=True)
    repairs = RepairSerializer(many=True)


class FaultRequestSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="kill, disk, slow, ecc, xid, dcgm, sdc, gpu-missing")


class FaultInjectedSerializer(serializers.Serializer):
    node = serializers.CharField()
    kind = serializers.CharField()
    injected_at = serializers.DateTimeField()
    emulated = serializers.BooleanField()


class FaultClearedSerializer(serializers.Serializer):
    node = serializers.CharField()
    cleared = serializers.CharField(help_text="The kind, or all")


class RepairRequestSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["reboot", "reimage", "replace"])


class NextRoundSerializer(serializers.Serializer):
    dcgm_level = serializers.IntegerField()
    reason = serializers.CharField()


class ReportAnswerSerializer(serializers.Serializer):
    accepted = serializers.BooleanField()
    ok = serializers.BooleanField(required=False, help_text="202 only")
    findings = serializers.ListField(child=serializers.CharField(), required=False)
    next_round = NextRoundSerializer(required=False, help_text="A deeper DCGM round, wanted")
    reason = serializers.CharField(required=False, help_text="200 only: why not stored")
