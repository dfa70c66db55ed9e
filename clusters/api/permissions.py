from rest_framework.permissions import SAFE_METHODS, BasePermission


class IsOperatorOrReadOnly(BasePermission):
    """Anyone signed in reads; operators (staff) create, change and delete clusters."""

    message = "Only operators (staff users) can create, change or delete clusters."

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return bool(request.user and request.user.is_staff)
