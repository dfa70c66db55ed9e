from django.urls import path

from . import views

app_name = "registry"

urlpatterns = [
    path("models/", views.model_list, name="model_list"),
    path("models/<str:name>/", views.model_detail, name="model_detail"),
]
