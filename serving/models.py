from django.db import models  # noqa: F401  (endpoints and replicas live here)
