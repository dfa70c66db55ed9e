from rest_framework import serializers


class IdentitySerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["local", "ldap", "single-user"])
    isolated = serializers.BooleanField(help_text="False: every job runs as mtc's own account")
    name = serializers.CharField(help_text="POSIX user name jobs run as")
    uid = serializers.IntegerField()
    gid = serializers.IntegerField()
    home = serializers.CharField()
    reason = serializers.CharField(
        help_text="Single-user only: why jobs are not isolated (empty otherwise)"
    )


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_operator = serializers.BooleanField()
    identity = IdentitySerializer()
