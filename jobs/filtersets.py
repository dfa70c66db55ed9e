import django_filters

from .choices import JobState
from .models import Job


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    user = django_filters.CharFilter()
    owner = django_filters.CharFilter(field_name="owner__username")
    partition = django_filters.CharFilter()
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Job
        fields = ["state", "user", "owner", "partition", "name"]
