from django.contrib import admin

from .models import Model, ModelAlias, ModelVersion


class ModelAliasInline(admin.TabularInline):
    model = ModelAlias
    extra = 0
    raw_id_fields = ["version"]


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "last_version_number", "update_time"]
    search_fields = ["name"]
    list_select_related = ["owner"]
    inlines = [ModelAliasInline]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "state", "recipe", "source_job", "parent", "create_time"]
    list_filter = ["state", "recipe"]
    search_fields = ["model__name"]
    list_select_related = ["model", "source_job__cluster", "parent__model"]
    raw_id_fields = ["source_job", "parent", "cluster", "created_by"]
