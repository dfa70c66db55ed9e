from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from mtc.api.errors import ApiError
from mtc.api.schema import errors

from ..selectors import identity_mode, single_user_reason
from ..services import IdentityMissing, account_ensure
from .serializers import MeSerializer


class MeView(APIView):
    @extend_schema(
        operation_id="identity_me",
        responses={200: MeSerializer, **errors(403)},
        summary="The signed-in user and their identity",
    )
    def get(self, request):
        try:
            account = account_ensure(user=request.user)
        except IdentityMissing as exc:
            raise ApiError(
                code="PERMISSION_DENIED", message=str(exc), status_code=status.HTTP_403_FORBIDDEN
            ) from exc
        mode = identity_mode()
        body = {
            "username": request.user.get_username(),
            "is_operator": request.user.is_staff,
            "identity": {
                "mode": mode,
                "isolated": mode != "single-user",
                "name": account.name,
                "uid": account.uid,
                "gid": account.gid,
                "home": account.home,
                "reason": single_user_reason(),
            },
        }
        return Response(MeSerializer(body).data)
