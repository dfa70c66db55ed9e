from django.urls import path

from . import views

app_name = "serving"

urlpatterns = [
    path("endpoints/", views.endpoint_list, name="endpoint_list"),
    path("endpoints/deploy/", views.endpoint_deploy, name="endpoint_deploy"),
    path("endpoints/<int:endpoint_id>/", views.endpoint_detail, name="endpoint_detail"),
    path("endpoints/<int:endpoint_id>/delete/", views.endpoint_delete, name="endpoint_delete"),
]
