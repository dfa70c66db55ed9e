"""/api/v1/accounts: Slurm accounts (teams), their members and limits. Everyone signed
in reads; operators write."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from mtc.api.errors import ApiError
from mtc.api.schema import errors
from slurm import SlurmError

from .. import accounts
from ..models import SlurmAccount
from .permissions import IsOperatorOrReadOnly

USERNAME_RE = r"[\w.@+-]{1,150}"


class AccountSerializer(serializers.ModelSerializer):
    members = serializers.SlugRelatedField(slug_field="username", many=True, read_only=True)

    class Meta:
        model = SlurmAccount
        fields = ["name", "description", *accounts.LIMIT_FIELDS, "members", "created_at"]


class AccountWriteSerializer(serializers.Serializer):
    """The body's shape, for the schema (clusters.accounts.validate checks it)."""

    name = serializers.CharField(required=False, help_text="Only on create")
    description = serializers.CharField(required=False)
    shares = serializers.IntegerField(required=False, allow_null=True, help_text="Fair-share")
    qos = serializers.CharField(required=False, help_text="QoS names, comma-separated")
    grp_tres = serializers.CharField(required=False, help_text="e.g. gres/gpu=16")
    grp_tres_mins = serializers.CharField(required=False, help_text="GPU-minutes budget")
    max_tres_per_user = serializers.CharField(required=False, help_text="e.g. gres/gpu=8")


def _bad(exc: accounts.AccountError) -> ApiError:
    return ApiError(code="INVALID_ARGUMENT", message=f"Invalid account: {exc}", fields=exc.fields)


def _conflict(exc: Exception) -> ApiError:
    return ApiError(code="CONFLICT", message=str(exc), status_code=status.HTTP_409_CONFLICT)


def _slurm(exc: SlurmError) -> ApiError:
    return ApiError(
        code="UNAVAILABLE" if not exc.permanent else "FAILED_PRECONDITION",
        message=f"Slurm: {exc}",
        status_code=503 if not exc.permanent else 409,
    )


def _account(name: str) -> SlurmAccount:
    account = accounts.account_get(name)
    if account is None:
        raise ApiError(code="NOT_FOUND", message=f"No account '{name}'.", status_code=404)
    return account


class AccountListView(APIView):
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]

    @extend_schema(operation_id="accounts_list", responses={200: AccountSerializer(many=True)})
    def get(self, request):
        rows = SlurmAccount.objects.prefetch_related("members")
        return Response(AccountSerializer(rows, many=True).data)

    @extend_schema(
        operation_id="accounts_create",
        request=AccountWriteSerializer,
        responses={201: AccountSerializer, **errors(409)},
    )
    def post(self, request):
        try:
            account = accounts.account_create(data=request.data)
        except accounts.AccountError as exc:
            raise _bad(exc) from exc
        except accounts.AccountConflict as exc:
            raise _conflict(exc) from exc
        return Response(AccountSerializer(account).data, status=201)


class AccountDetailView(APIView):
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]

    @extend_schema(operation_id="accounts_retrieve", responses={200: AccountSerializer})
    def get(self, request, name):
        return Response(AccountSerializer(_account(name)).data)

    @extend_schema(
        operation_id="accounts_update",
        request=AccountWriteSerializer,
        responses={200: AccountSerializer, **errors(409, 503)},
    )
    def patch(self, request, name):
        account = _account(name)
        try:
            account = accounts.account_update(account=account, data=request.data)
        except accounts.AccountError as exc:
            raise _bad(exc) from exc
        except SlurmError as exc:
            raise _slurm(exc) from exc
        return Response(AccountSerializer(account).data)

    @extend_schema(operation_id="accounts_delete", responses={204: None, **errors(409, 503)})
    def delete(self, request, name):
        try:
            accounts.account_delete(account=_account(name))
        except accounts.AccountConflict as exc:
            raise _conflict(exc) from exc
        except SlurmError as exc:
            raise _slurm(exc) from exc
        return Response(status=204)


class AccountUserView(APIView):
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]

    def _user(self, username):
        user = accounts.user_get(username)
        if user is None:
            raise ApiError(code="NOT_FOUND", message=f"No user '{username}'.", status_code=404)
        return user

    @extend_schema(
        operation_id="accounts_user_add", request=None, responses={200: AccountSerializer}
    )
    def post(self, request, name, username):
        account = _account(name)
        accounts.account_user_add(account=account, user=self._user(username))
        return Response(AccountSerializer(account).data)

    @extend_schema(
        operation_id="accounts_user_remove",
        responses={200: AccountSerializer, **errors(409, 503)},
    )
    def delete(self, request, name, username):
        account = _account(name)
        user = self._user(username)
        posix = getattr(getattr(user, "posix_account", None), "name", None)
        try:
            accounts.account_user_remove(account=account, user=user, posix_name=posix)
        except SlurmError as exc:
            raise _slurm(exc) from exc
        return Response(AccountSerializer(account).data)
