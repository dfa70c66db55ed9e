from django.urls import re_path

from .views import (
    EndpointCompletionsView,
    EndpointDetailView,
    EndpointListView,
    EndpointMetricsView,
    EndpointModelsView,
    EndpointModelView,
)

app_name = "serving_api"
ENDPOINT = r"^endpoints/(?P<endpoint_id>[0-9]+)"

urlpatterns = [
    re_path(r"^endpoints/?$", EndpointListView.as_view(), name="endpoint-list"),
    re_path(ENDPOINT + r"/?$", EndpointDetailView.as_view(), name="endpoint-detail"),
    re_path(ENDPOINT + r"/metrics/?$", EndpointMetricsView.as_view(), name="endpoint-metrics"),
    re_path(
        ENDPOINT + r"/completions/?$",
        EndpointCompletionsView.as_view(),
        name="endpoint-completions",
    ),
    re_path(
        ENDPOINT + r"/chat/completions/?$",
        EndpointCompletionsView.as_view(chat=True, action_name="chat_completions"),
        name="endpoint-chat-completions",
    ),
    re_path(ENDPOINT + r"/models/?$", EndpointModelsView.as_view(), name="endpoint-models"),
    re_path(
        ENDPOINT + r"/models/(?P<model_id>[^/]+)/?$",
        EndpointModelView.as_view(),
        name="endpoint-model",
    ),
]
