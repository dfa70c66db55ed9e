"""Page-number pages, as the schema says: a page that is not a whole number of 1 or more
is a 404 like one past the last (not page 1), a page_size that is not one a 400 (not
silently the default)."""

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination


class StandardPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_number(self, request, paginator):
        raw = request.query_params.get(self.page_query_param)
        if raw is not None and not _whole(raw):
            raise NotFound("Invalid page: a whole number of 1 or more.")
        return super().get_page_number(request, paginator)

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and not _whole(raw):
            raise ValidationError({"page_size": "Must be a whole number of 1 or more."})
        return super().get_page_size(request)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1  # page 0 is a 404, page_size 0 a 400
        return parameters


def _whole(raw: str) -> bool:
    return raw.isascii() and raw.isdigit() and int(raw) >= 1
