from django.urls import re_path

from .views import AliasView, ModelDetailView, ModelListView, VersionDetailView, VersionListView

# Any name reaches the views, which answer 404 for one that is not registered.
MODEL = r"^models/(?P<name>[^/]+)"

urlpatterns = [
    re_path(r"^models/?$", ModelListView.as_view(), name="model-list"),
    re_path(MODEL + r"/?$", ModelDetailView.as_view(), name="model-detail"),
    re_path(MODEL + r"/versions/?$", VersionListView.as_view(), name="model-version-list"),
    re_path(
        MODEL + r"/versions/(?P<number>[0-9]{1,9})/?$",
        VersionDetailView.as_view(),
        name="model-version-detail",
    ),
    re_path(MODEL + r"/aliases/?$", AliasView.as_view(), name="model-aliases"),
]
