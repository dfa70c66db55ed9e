from django.contrib import admin

from .models import Job, JobEvent


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["job_id", "cluster", "name", "owner", "state", "partition", "submit_time"]
    list_filter = ["state", "cluster"]
    search_fields = ["job_id", "name"]
    inlines = [JobEventInline]
    list_select_related = ["cluster", "owner"]
