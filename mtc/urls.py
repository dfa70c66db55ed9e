from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from health.prometheus import MetricsView

from . import probes, token_views

api_v1 = [
    path("tokens", token_views.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>", token_views.TokenDetailView.as_view(), name="api-token"),
    path("", include("identity.api.urls")),
    path("", include("clusters.api.urls")),
    path("", include("jobs.api.urls")),
    path("", include("recipes.api.urls")),
    path("", include("health.api.urls")),
    path("", include("registry.api.urls")),
    path("", include("serving.api.urls")),
    # JSON, not the HTML 404 page; [\s\S] so a path with a newline in it is caught too.
    re_path(r"^[\s\S]*$", probes.api_not_found),
]

urlpatterns = [
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("metrics", MetricsView.as_view(), name="prometheus-metrics"),
    path("admin/", admin.site.urls),
    path("profile/tokens/", token_views.token_page, name="token_page"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("vendor/plotly.min.js", probes.plotly_js, name="plotly-js"),
    path("", include("identity.urls")),
    path("", include("recipes.urls")),
    path("", include("jobs.urls")),
    path("", include("health.urls")),
    path("", include("registry.urls")),
    path("", include("serving.urls")),
    path("", include("clusters.urls")),
]
