from django.urls import path

from . import views

app_name = "clusters"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]
