"""Page-number pages, as the schema says: a page that is not a whole number of 1 or more
is a 404 like one past the last (not page 1), a page_size that is not one a 400 (not
silently the default)."""

from django.core.paginator import Paginator
from django.utils.functional import cached_property
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination


class CountFromPaginator(Paginator):
    """Counts ``object_list.count_from`` where a list carries one: a values() list whose
    joins only name each row (its cluster's id, its owner's name) has the same rows as
    the queryset it came from, which counts them off an index without those joins (at
    20,000 jobs 0.3 ms instead of 1.4 ms, and it grows with the rows)."""

    @cached_property
    def count(self) -> int:
        source = getattr(self.object_list, "count_from", None)
        return source.count() if source is not None else super().count


class StandardPagination(PageNumberPagination):
    django_paginator_class = CountFromPaginator
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
