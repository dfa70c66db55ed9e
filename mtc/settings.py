"""Settings from the environment, with defaults that work on a laptop.

MTC_DATA_DIR  where SQLite, local clusters and secrets live (default ./var)
MTC_PORT      the web server's port (default 8000)
DATABASE_URL  default: SQLite in MTC_DATA_DIR; postgres://... for PostgreSQL
REDIS_URL     Celery's broker (default redis://127.0.0.1:6389/0, the Redis `make run` starts)
MTC_PROVIDER  local (default) or gce; MTC_GCE_* configure the gce provider (README)
MTC_PRODUCTION=1  behind a TLS proxy (deploy/): secure cookies, HSTS, HTTPS redirect,
              DEBUG off; needs MTC_ALLOWED_HOSTS (README, "Running mtc on a server")
"""

import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from mtc.redisauth import redis_password, with_credentials
from mtc.secretfile import secret_create

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("MTC_DATA_DIR", BASE_DIR / "var")).resolve()
DATA_DIR.mkdir(mode=0o711, parents=True, exist_ok=True)
if os.stat(DATA_DIR).st_uid == os.geteuid():
    # mtc's alone: others may only pass through to their own job directories below
    # (clusters/<id>/users/<name>/, home/<name>/), never list or read anything.
    os.chmod(DATA_DIR, 0o711)
MTC_PORT = int(os.environ.get("MTC_PORT", "8000"))


def _secret_key() -> str:
    if os.environ.get("MTC_SECRET_KEY"):
        return os.environ["MTC_SECRET_KEY"]
    key_file = DATA_DIR / "secret_key"
    secret_create(key_file, secrets.token_urlsafe(50))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
PRODUCTION = os.environ.get("MTC_PRODUCTION", "0") == "1"
DEBUG = os.environ.get("MTC_DEBUG", "0") == "1" and not PRODUCTION
# Where node agents reach mtc's API (they POST their reports there with a node token).
MTC_PUBLIC_URL = os.environ.get("MTC_PUBLIC_URL", f"http://127.0.0.1:{MTC_PORT}")
if PRODUCTION and not os.environ.get("MTC_ALLOWED_HOSTS"):
    raise ImproperlyConfigured("MTC_PRODUCTION=1 needs MTC_ALLOWED_HOSTS (the names mtc serves)")
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("MTC_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")
    if h.strip()
]
# mtc hands MTC_PUBLIC_URL to its node agents: its host must be one mtc answers on.
_public_host = urlparse(MTC_PUBLIC_URL).hostname
if _public_host and _public_host not in ALLOWED_HOSTS:
    ALLOWED_HOSTS.append(f"[{_public_host}]" if ":" in _public_host else _public_host)

if PRODUCTION:
    # TLS ends at the reverse proxy (deploy/nginx-mtc.conf), which sets X-Forwarded-Proto;
    # gunicorn listens on loopback only, so no client can forge that header.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    # Probes and node agents talk to gunicorn on loopback over plain HTTP; a redirect
    # would break their POSTs and protect nothing (the token was already sent).
    SECURE_REDIRECT_EXEMPT = [
        r"^healthz$",
        r"^readyz$",
        r"^api/v1/clusters/[^/]+/nodes/[^/]+/health/report/?$",
    ]
    SECURE_HSTS_SECONDS = int(os.environ.get("MTC_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = os.environ.get("MTC_HSTS_SUBDOMAINS", "1") == "1"
    SECURE_HSTS_PRELOAD = os.environ.get("MTC_HSTS_PRELOAD", "0") == "1"
    if not SECURE_HSTS_PRELOAD:
        # Asking browsers to preload the domain is its owner's decision (hstspreload.org).
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",  # sign-in lockout (below: AXES_*)
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "mtc",
    "identity",
    "clusters",
    "jobs",
    "recipes",
    "health",
    "registry",
    "serving",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "mtc.middleware.NulInUrlMiddleware",
    # Before sessions: a cached API read needs none of what follows (mtc/api/readcache.py).
    "mtc.api.readcache.ApiReadCacheMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "mtc.middleware.LoginRequiredMiddleware",
    "mtc.api.errors.ApiErrorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: a locked-out sign-in answers its page (429).
    "axes.middleware.AxesMiddleware",
]
if os.environ.get("MTC_SERVER_TIMING") == "1":
    # Outermost, so the figures cover every middleware too.
    MIDDLEWARE.insert(0, "mtc.middleware.ServerTimingMiddleware")

ROOT_URLCONF = "mtc.urls"
CSRF_FAILURE_VIEW = "mtc.api.errors.csrf_failure"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "health.context_processors.nav_repairs",
                "identity.context_processors.identity",
            ],
        },
    },
]
WSGI_APPLICATION = "mtc.wsgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'mtc.sqlite3'}"),
        conn_max_age=60,
        # A kept connection the server closed (a PostgreSQL restart) is replaced, not used.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Web requests, the worker and beat write the same file: wait for locks instead of
    # failing; mtc/sqlite waits for a transaction's write lock in short steps.
    DATABASES["default"]["ENGINE"] = "mtc.sqlite"
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # CONN_MAX_AGE stays 60: gunicorn's threads are a fixed pool and each keeps its
    # connection (opening one and its PRAGMAs cost a third of a small API request).
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise reads it at startup, collected or not
# WhiteNoise serves static files from gunicorn itself (no CDN, no proxy config).
# `make run` and the systemd unit collect them into STATIC_ROOT before starting; in
# production their names carry a content hash, so browsers may cache them for a year.
# Elsewhere (tests, manage.py) WhiteNoise also finds them in the apps' folders.
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = DEBUG
if PRODUCTION:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first, so an anonymous request gets 401 with WWW-Authenticate: Token.
        "mtc.api.auth.TokenAuthentication",  # hashed keys; Token or Bearer
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies only: one content type per operation, and a body nested too deep is a 400.
    "DEFAULT_PARSER_CLASSES": ["mtc.api.parsers.JsonParser"],
    "DEFAULT_PAGINATION_CLASS": "mtc.api.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["mtc.api.filters.FilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "mtc.api.schema.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["mtc.api.throttle.TokenRateThrottle"],
    "EXCEPTION_HANDLER": "mtc.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "mtc API",
    "DESCRIPTION": "Managed training clusters: clusters, operations, nodes, jobs and health.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI and ReDoc from the sidecar package: machines may be offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Its deploy check grades the OpenAPI schema's docs (missing serializers on APIViews,
    # operationId collisions), not the deployment: `check --deploy` stays about security.
    "ENABLE_DJANGO_DEPLOY_CHECK": False,
    # mtc/api/schema.py: the API's paths only, written as documented (no trailing slash).
    "PREPROCESSING_HOOKS": ["mtc.api.schema.api_only"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "mtc.api.schema.documented_paths",
    ],
    "TAGS": [
        {"name": "clusters", "description": "Slurm clusters: create, resize, delete"},
        {"name": "operations", "description": "Long-running cluster operations"},
        {"name": "nodes", "description": "A cluster's nodes, as last polled"},
        {"name": "jobs", "description": "Slurm jobs: submit, control, output"},
        {"name": "usage", "description": "GPU-hours, CPU-hours and jobs from accounting"},
        {"name": "recipes", "description": "Prebuilt LLM training jobs"},
        {"name": "health", "description": "Node health, faults and agents' reports"},
        {"name": "repairs", "description": "Node repairs (operators)"},
        {"name": "models", "description": "The model registry"},
        {"name": "endpoints", "description": "Inference endpoints (OpenAI-shaped)"},
        {"name": "tokens", "description": "Your API tokens"},
        {"name": "accounts", "description": "Slurm accounts (teams), members and limits"},
        {"name": "identity", "description": "Who you are and which account jobs run as"},
    ],
}

# The Redis `make run` starts logs in mtc's own ACL user with the data dir's password
# (mtc/redisauth.py); a REDIS_URL from the environment is used as it is (a site's Redis
# with its own credentials in the URL, or the one `make test` starts).
REDIS_URL = os.environ.get("REDIS_URL") or with_credentials(
    "redis://127.0.0.1:6389/0", redis_password(DATA_DIR)
)
# Token-authenticated API reads are kept this many seconds in Redis, served again to the
# same user and dropped at once by a write to their path (mtc/api/readcache.py); 0: off.
MTC_API_READ_CACHE_SECONDS = float(os.environ.get("MTC_API_READ_CACHE_SECONDS", "1"))
# A cluster's job list counts its jobs from a tally in Redis, not COUNT(*) over its whole
# history (jobs/tally.py); 0: off.
MTC_JOB_TALLY = os.environ.get("MTC_JOB_TALLY", "1") == "1"
# Django's cache (sign-in failures, the cloud metrics' short cache) in the same Redis, so
# every web and worker process counts together; Redis away reads as empty (mtc/cache.py).
CACHES = {
    "default": {
        "BACKEND": "mtc.cache.FailOpenRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "mtc:cache",
        "OPTIONS": {"socket_timeout": 1, "socket_connect_timeout": 1},
    }
}
# Sign-in lockout (django-axes): MTC_SIGNIN_FAILURES wrong passwords for one username
# from one address lock that pair out for MTC_SIGNIN_LOCKOUT_MINUTES, so a tenant cannot
# lock an operator out from elsewhere. The attempts are rows in the database every web
# process shares; an operator sees them in the admin (Axes, "Access attempts") and
# unlocks there or with `python manage.py axes_reset_username <name>`.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_DISABLE_ACCESS_LOG = True  # failures are kept; a row per successful sign-in is not
AXES_FAILURE_LIMIT = int(os.environ.get("MTC_SIGNIN_FAILURES", "20"))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("MTC_SIGNIN_LOCKOUT_MINUTES", "30")))
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
if PRODUCTION:
    # Behind the one proxy (deploy/nginx-mtc.conf sets X-Forwarded-For): the client's
    # address is the proxy's last hop, not the loopback every request comes from.
    AXES_IPWARE_PROXY_COUNT = 1
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
# Per API token (per user for a session) and minute, counted in Redis (mtc/api/throttle.py):
# a runaway script gets 429 with Retry-After; the load bench's one-token mix (~35,000 a
# minute) stays under the default. 0: no limit.
MTC_API_RATE_PER_MINUTE = int(os.environ.get("MTC_API_RATE_PER_MINUTE", "60000"))
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 1800
CELERY_TASK_TIME_LIMIT = 1900
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = os.environ.get("MTC_CELERY_EAGER", "0") == "1"
CELERY_TASK_EAGER_PROPAGATES = False
CELERY_BEAT_SCHEDULE = {
    "nodes-poll": {"task": "clusters.tasks.nodes_poll_all", "schedule": 5.0},
    "jobs-poll": {"task": "jobs.tasks.jobs_poll_all", "schedule": 3.0},
    "recipe-metrics": {"task": "recipes.tasks.recipe_metrics_ingest_all", "schedule": 3.0},
    "health-poll": {"task": "health.tasks.health_poll_all", "schedule": 2.0},
    "clusters-reconcile": {"task": "clusters.tasks.clusters_reconcile_all", "schedule": 10.0},
    "registry-poll": {"task": "registry.tasks.registrations_poll", "schedule": 5.0},
    "serving-reconcile": {"task": "serving.tasks.endpoints_reconcile_all", "schedule": 3.0},
    "tensorboard-idle": {"task": "recipes.tasks.tensorboards_stop_idle", "schedule": 60.0},
    "cloud-metrics-export": {"task": "health.tasks.cloud_metrics_export_all", "schedule": 60.0},
    # Retention (below): a few seconds' work a run once caught up; a backlog drains over runs.
    "retention-purge": {"task": "mtc.tasks.retention_purge", "schedule": 300.0},
}
# A poll still queued when its next round is due is stale: it expires instead of
# piling up behind a slow worker (the overlap lock is mtc.polls.single_flight).
for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry.setdefault("options", {}).setdefault("expires", _entry["schedule"])
# Two queues, one worker pool each (`make run`, deploy/): the polls beat sends every few
# seconds (one sinfo/squeue per cluster, metrics, probes) can take long on a big fleet;
# an operation someone waits for (create, delete, resize, repair, export, a user's
# endpoint change) must never queue behind them. What is not routed is an operation.
CELERY_TASK_DEFAULT_QUEUE = "operations"
CELERY_TASK_ROUTES = [
    "mtc.queue.route_poll_fanout",  # what a poll sends out per row is part of the poll
    {entry["task"]: {"queue": "polls"} for entry in CELERY_BEAT_SCHEDULE.values()},
]
# beat's shelve is created with the umask's mode: a 0700 folder keeps it mtc's alone.
(DATA_DIR / "celery").mkdir(mode=0o700, exist_ok=True)
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celery" / "celerybeat-schedule")


def _retention_days(name: str, default: float) -> float:
    """Days from the environment; 0 (or "none", "forever") keeps the rows forever."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("none", "forever", "never"):
        return 0.0
    try:
        days = float(raw) if raw else float(default)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number of days, not {raw!r}") from None
    if days < 0 or days != days:
        raise ImproperlyConfigured(f"{name} must be 0 (keep forever) or more days, not {raw!r}")
    return days


# Retention (README, "Retention"): how many days finished rows, and the files that go
# with them, are kept before the beat task mtc.tasks.retention_purge removes them.
# Only finished things are ever purged: never a queued or running job, an active
# operation, an open failure or repair, or a live endpoint.
# Finished jobs (from their end): their events, metric points, output files and a
# recipe run's directory; a job a model version was registered from is kept.
MTC_RETENTION_JOBS_DAYS = _retention_days("MTC_RETENTION_JOBS_DAYS", 90)
# Finished operations (create, resize, delete, repair), from their end.
MTC_RETENTION_OPERATIONS_DAYS = _retention_days("MTC_RETENTION_OPERATIONS_DAYS", 90)
# Finished repairs and resolved node failures: the repair history, MTTR, failures by mode.
MTC_RETENTION_REPAIRS_DAYS = _retention_days("MTC_RETENTION_REPAIRS_DAYS", 180)
# Health reports: every one for MTC_RETENTION_HEALTH_REPORTS_FULL_DAYS, then one per
# node, source and hour until MTC_RETENTION_HEALTH_REPORTS_DAYS, then none.
MTC_RETENTION_HEALTH_REPORTS_DAYS = _retention_days("MTC_RETENTION_HEALTH_REPORTS_DAYS", 14)
MTC_RETENTION_HEALTH_REPORTS_FULL_DAYS = _retention_days(
    "MTC_RETENTION_HEALTH_REPORTS_FULL_DAYS", 1
)
# Endpoint request records (the rate, latency and autoscaling figures look back minutes).
MTC_RETENTION_ENDPOINT_REQUESTS_DAYS = _retention_days("MTC_RETENTION_ENDPOINT_REQUESTS_DAYS", 1)
# An endpoint's history: its events, and its ended replicas with their run directories.
MTC_RETENTION_ENDPOINT_HISTORY_DAYS = _retention_days("MTC_RETENTION_ENDPOINT_HISTORY_DAYS", 90)
# A cluster's daemon and agent logs (log/ of a local cluster) not written to for this
# long (a removed node's); a log still written to is cut to its newest half once it
# passes MTC_RETENTION_LOG_MAX_MB (0: never cut).
MTC_RETENTION_LOGS_DAYS = _retention_days("MTC_RETENTION_LOGS_DAYS", 30)
MTC_RETENTION_LOG_MAX_MB = _retention_days("MTC_RETENTION_LOG_MAX_MB", 256)
# Seconds one purge run may take; what is left waits for the next (every 5 minutes).
MTC_RETENTION_RUN_S = float(os.environ.get("MTC_RETENTION_RUN_S", "20"))

# A running recipe job with no new step for max(5 x its median step time, this) is hung
# (recipes/hang.py).
MTC_HANG_FLOOR_S = float(os.environ.get("MTC_HANG_FLOOR_S", "60"))

# Local provider limits (one host runs every node's slurmd).
MTC_LOCAL_MAX_NODES_PER_CLUSTER = int(os.environ.get("MTC_LOCAL_MAX_NODES", "64"))
MTC_LOCAL_PORT_RANGE = (17000, 29999)
# Each emulated node's scratch capacity (its files count against it; the host's disk
# is shared), and whether each node runs its health agent as a daemon.
MTC_LOCAL_SCRATCH_GB = float(os.environ.get("MTC_LOCAL_SCRATCH_GB", "4"))
MTC_LOCAL_NODE_AGENTS = os.environ.get("MTC_LOCAL_NODE_AGENTS", "1") == "1"
MTC_AGENT_INTERVAL_S = float(os.environ.get("MTC_AGENT_INTERVAL_S", "10"))
# The local nodes' slurmd and agents stand for other machines: on this one they yield the
# CPU to the control plane (0: same priority).
MTC_LOCAL_NODE_NICE = int(os.environ.get("MTC_LOCAL_NODE_NICE", "10"))
# Slurm accounting (mtc/accounting.py): the installation's slurmdbd on 127.0.0.1 at this
# port, started by `make run` and `make test`. Unset or 0: local clusters run without
# accounting (no sacct; a job that leaves the queue unseen becomes UNKNOWN).
MTC_SLURMDBD_PORT = int(os.environ.get("MTC_SLURMDBD_PORT") or 0)
# Every user's Slurm account when operators have put them in none (clusters/accounts.py).
MTC_DEFAULT_ACCOUNT = os.environ.get("MTC_DEFAULT_ACCOUNT", "users")
MTC_ACCOUNTING_DIR = Path(os.environ.get("MTC_ACCOUNTING_DIR") or DATA_DIR / "accounting")
# How long a job that left the queue may be missing from sacct (slurmctld sends its
# record late when slurmdbd was away) before it becomes UNKNOWN.
MTC_ACCOUNTING_GRACE_S = float(os.environ.get("MTC_ACCOUNTING_GRACE_S", "600"))
# Seconds to pause at each Operation step: slow motion for demos and for the test
# that kills a worker in the middle of a create.
MTC_OPERATION_STEP_DELAY = float(os.environ.get("MTC_OPERATION_STEP_DELAY", "0"))
# The fabric check (health/fabric.py) before a new cluster takes work and after a repair
# before the node is resumed: ~20 s on the local provider, so scripts/test.sh turns it off.
MTC_FABRIC_CHECK_ON_CREATE = os.environ.get("MTC_FABRIC_CHECK_ON_CREATE", "1") == "1"
MTC_FABRIC_CHECK_ON_REPAIR = os.environ.get("MTC_FABRIC_CHECK_ON_REPAIR", "1") == "1"

# A cluster's TensorBoard (one process, reached through mtc) stops after this long idle.
MTC_TENSORBOARD_IDLE_S = float(os.environ.get("MTC_TENSORBOARD_IDLE_S", "900"))

# Whose Unix account jobs run as (README, "Identity"): "local" (mtc makes accounts
# in MTC_UID_RANGE; the default as root), "ldap", or "single-user" (mtc's own user;
# what mtc is when it is not root, whatever is set here).
MTC_IDENTITY = os.environ.get("MTC_IDENTITY", "")
if MTC_IDENTITY not in ("", "local", "ldap", "single-user"):
    raise ImproperlyConfigured(
        f"MTC_IDENTITY must be local, ldap or single-user, not {MTC_IDENTITY!r}"
    )
MTC_UID_RANGE = os.environ.get("MTC_UID_RANGE", "20000-29999")
# A version's export (python -m node.export, as the job's owner) runs under these limits:
# its address space (the whole model is held once), and its wall-clock time.
MTC_EXPORT_MEMORY_GB = float(os.environ.get("MTC_EXPORT_MEMORY_GB", "32"))
MTC_EXPORT_TIMEOUT_S = float(os.environ.get("MTC_EXPORT_TIMEOUT_S", "3600"))

# The provider a spec gets when it names none, and what `make run` sets up: "local"
# (a demo cluster of Slurm daemons on this machine) or "gce" (checks the project).
MTC_PROVIDER = os.environ.get("MTC_PROVIDER", "local")
if MTC_PROVIDER not in ("local", "gce"):
    raise ImproperlyConfigured(f"MTC_PROVIDER must be local or gce, not {MTC_PROVIDER!r}")

# The gce provider (README, "Running on Compute Engine"). Credentials are Application
# Default Credentials; MTC_GCE_API_ENDPOINT points every client elsewhere (tests).
MTC_GCE_PROJECT = os.environ.get("MTC_GCE_PROJECT", "")
MTC_GCE_IMAGE = os.environ.get(
    "MTC_GCE_IMAGE", "projects/{project}/global/images/family/mtc-slurm-22-05"
)
MTC_GCE_SUBNET_RANGE = os.environ.get("MTC_GCE_SUBNET_RANGE", "10.128.0.0/20")
# The service account every node runs as ({project} is the cluster's project).
MTC_GCE_SERVICE_ACCOUNT = os.environ.get(
    "MTC_GCE_SERVICE_ACCOUNT", "mtc-nodes@{project}.iam.gserviceaccount.com"
)
MTC_GCE_API_ENDPOINT = os.environ.get("MTC_GCE_API_ENDPOINT", "")
# Cloud Monitoring's client speaks gRPC only: host:port here (plain text when anonymous).
MTC_GCE_MONITORING_ENDPOINT = os.environ.get("MTC_GCE_MONITORING_ENDPOINT", "")
# Cloud Monitoring's REST API (dashboards); the tests point it at their local endpoint.
MTC_GCE_DASHBOARD_ENDPOINT = os.environ.get(
    "MTC_GCE_DASHBOARD_ENDPOINT", "https://monitoring.googleapis.com"
)
# Storage APIs (REST JSON): Filestore, Managed Lustre, Service Networking; the tests
# point each at their local endpoint. Lustre can take most of an hour to become ACTIVE.
MTC_GCE_FILESTORE_ENDPOINT = os.environ.get(
    "MTC_GCE_FILESTORE_ENDPOINT", "https://file.googleapis.com"
)
MTC_GCE_LUSTRE_ENDPOINT = os.environ.get("MTC_GCE_LUSTRE_ENDPOINT", "https://lustre.googleapis.com")
MTC_GCE_SERVICENETWORKING_ENDPOINT = os.environ.get(
    "MTC_GCE_SERVICENETWORKING_ENDPOINT", "https://servicenetworking.googleapis.com"
)
MTC_GCE_STORAGE_TIMEOUT_S = float(os.environ.get("MTC_GCE_STORAGE_TIMEOUT_S", "3600"))
# mtc's own VPC and subnetwork: clusters go on it unless their spec names a network
# (then it is peered with this one). MTC_GCE_CONTROL_ADDRESS: mtc's host as the cluster
# sees it (the firewall rule to slurmctld); empty = the address of the default route.
MTC_GCE_NETWORK = os.environ.get("MTC_GCE_NETWORK", "default")
MTC_GCE_SUBNETWORK = os.environ.get("MTC_GCE_SUBNETWORK", "")
MTC_GCE_CONTROL_ADDRESS = os.environ.get("MTC_GCE_CONTROL_ADDRESS", "")
MTC_GCE_ANONYMOUS = os.environ.get("MTC_GCE_ANONYMOUS", "0") == "1"
MTC_GCE_POLL_S = float(os.environ.get("MTC_GCE_POLL_S", "1.0"))
MTC_GCE_RETRIES = int(os.environ.get("MTC_GCE_RETRIES", "4"))
MTC_GCE_OPERATION_TIMEOUT_S = float(os.environ.get("MTC_GCE_OPERATION_TIMEOUT_S", "900"))
MTC_GCE_READY_TIMEOUT_S = float(os.environ.get("MTC_GCE_READY_TIMEOUT_S", "1800"))

# The `ldap` source: people sign in with their directory password (django-auth-ldap) and
# their posixAccount entry is their identity. mtc binds as MTC_LDAP_BIND_DN to look them up.
MTC_LDAP_URI = os.environ.get("MTC_LDAP_URI", "ldap://127.0.0.1:389/")
MTC_LDAP_BIND_DN = os.environ.get("MTC_LDAP_BIND_DN", "")
MTC_LDAP_BIND_PASSWORD = os.environ.get("MTC_LDAP_BIND_PASSWORD", "")
MTC_LDAP_USER_BASE = os.environ.get("MTC_LDAP_USER_BASE", "")
MTC_LDAP_USER_FILTER = os.environ.get("MTC_LDAP_USER_FILTER", "(uid=%(user)s)")
MTC_LDAP_TIMEOUT_S = float(os.environ.get("MTC_LDAP_TIMEOUT_S", "5"))
# django-axes first: a locked-out username and address is refused before any password
# is checked. The directory next in `ldap` mode; ModelBackend stays for the local admin
# `make run` creates.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    *(["identity.ldap_backend.DirectoryBackend"] if MTC_IDENTITY == "ldap" else []),
    "django.contrib.auth.backends.ModelBackend",
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("MTC_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
