from django.contrib import admin

from .models import PosixAccount


@admin.register(PosixAccount)
class PosixAccountAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "uid", "gid", "home", "source", "created")
    search_fields = ("user__username", "name")
    readonly_fields = ("created",)
