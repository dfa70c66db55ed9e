from django.urls import re_path

from .views import MeView

urlpatterns = [re_path(r"^me/?$", MeView.as_view(), name="me")]
