"""Flat, environment-driven settings.

With no variable set this is the embedded default: SQLite, an in-memory channel layer and the
scheduling cycle running inside the web process on a timer. DATABASE_URL and REDIS_URL switch to the
production stack (PostgreSQL through psycopg 3, Redis for Celery and Channels).
"""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
import plotly
from celery.schedules import crontab
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE

BASE_DIR = Path(__file__).resolve().parent.parent


def envbool(name, default):
    return os.getenv(name, default).lower() in ("1", "true", "yes", "on")


def envint(name, default):
    return int(os.getenv(name, default))


def envfloat(name, default):
    return float(os.getenv(name, default))


PRODUCTION = envbool("PRODUCTION", "False")
DEBUG = envbool("DEBUG", "False" if PRODUCTION else "True")
SECRET_KEY = os.getenv("SECRET_KEY", "" if PRODUCTION else "dev-only-insecure-key-do-not-use-in-production")
if PRODUCTION and len(SECRET_KEY) < 50:
    raise RuntimeError("PRODUCTION=True needs a SECRET_KEY of at least 50 characters")

ALLOWED_HOSTS = os.getenv("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.getenv("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
SITE_NAME = os.getenv("SITE_NAME", "Capacity Broker")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "csp",
    "broker.inventory",
    "broker.policy",
    "broker.workloads",
    "broker.audit",
    "broker.api",
    "broker.cycle",
    "broker.costs",
    "broker.metrics",
    "broker.governance",
    "broker.kube",
    "dashboard",
    "axes",
]

MIDDLEWARE = [
    # Refuses an oversized body from its Content-Length, and NUL in a query string, before anything reads them.
    "broker.api.middleware.RequestLimitsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Pages and JSON (the rack heatmap is ~500 KB of JSON at 100k devices). Below WhiteNoise, so static
    # files are not compressed again on every request: browsers cache them instead (vendor_cache_headers).
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "broker.governance.access.RolePagesMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.errors.NotFoundPageMiddleware",
    # Last: turns a login refused for a lockout into broker.governance.lockouts.lockout_response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "broker.urls"
WSGI_APPLICATION = "broker.wsgi.application"
ASGI_APPLICATION = "broker.asgi.application"

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
                "dashboard.context_processors.site",
                "dashboard.context_processors.navigation",
                "dashboard.context_processors.live_updates",
                "csp.context_processors.nonce",
                "dashboard.context_processors.live_cycle",
            ],
        },
    },
]

DATA_DIR = Path(os.getenv("DATA_DIR", BASE_DIR / "var"))
DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASE_URL = os.getenv("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", "0"))}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.getenv("SQLITE_PATH", str(DATA_DIR / "broker.sqlite3")),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.getenv("TEST_DATABASE_NAME", "test_capacity_broker")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.getenv("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
    CELERY_BROKER_URL = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
# The dashboard's shared aggregates (dashboard.inventory_state.cached): one process in the embedded
# default, every web process and worker through Redis otherwise.
if REDIS_URL:
    # Short timeouts: with Redis cut off, a page waits a second for the cache, then reads the database.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", "False" if REDIS_URL else "True")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# "celery": beat and the worker run cycles; "inprocess": the web process runs them on a timer.
CYCLE_MODE = os.getenv("CYCLE_MODE", "celery" if REDIS_URL else "inprocess")
CYCLE_INTERVAL_SECONDS = envfloat("CYCLE_INTERVAL_SECONDS", "3")
CYCLE_DEBOUNCE_SECONDS = envfloat("CYCLE_DEBOUNCE_SECONDS", "0.5")
CLUSTER_NAME = os.getenv("CLUSTER_NAME", "default")
# Before its first cycle a process that runs them (each Celery worker process, `manage.py serve`'s loop)
# reads and indexes the cluster once, so that cycle is as fast as the later ones (broker.cycle.runner.warm_up).
CYCLE_WARM_UP = envbool("CYCLE_WARM_UP", "True")
# A worker process reports ready to Celery only after that warm-up: at 100k devices a few seconds, over
# Celery's default wait of 4 s before it kills the process as stuck.
CELERY_WORKER_PROC_ALIVE_TIMEOUT = envfloat("CELERY_WORKER_PROC_ALIVE_TIMEOUT", "60")
# After a committed cycle that admitted or preempted at least this many workloads, the process that ran
# it reads them back, once its executor has started them (broker.cycle.runner.read_back): the next cycle's
# load then finds their records built instead of building them itself. 0 = never.
CYCLE_READ_BACK_MIN_WORKLOADS = envint("CYCLE_READ_BACK_MIN_WORKLOADS", "1000")
CELERY_BEAT_SCHEDULE = {
    "scheduling-cycle": {"task": "broker.cycle.tasks.run_cycle", "schedule": CYCLE_INTERVAL_SECONDS},
    "simulated-executor": {"task": "broker.cycle.tasks.advance_executor", "schedule": CYCLE_INTERVAL_SECONDS},
    "governance": {"task": "broker.governance.tasks.governance_tick", "schedule": CYCLE_INTERVAL_SECONDS},
    # At a fixed time rather than every 24 h: an interval restarts with beat, so a beat restarted more
    # often than daily (without its schedule file) would never prune.
    "prune-history": {"task": "broker.cycle.tasks.prune_history", "schedule": crontab(hour=3, minute=30)},
}
# How often beat (or the embedded default's loop) rolls up the whole hours past into the hourly rollups
# the reports and the scrape read (broker/costs/rolling.py, broker/metrics/rolling.py). Off the cycle's
# path: at 100k devices an hour of the cost of pending takes seconds to roll up.
ROLLUP_INTERVAL_SECONDS = envfloat("ROLLUP_INTERVAL_SECONDS", "60")
CELERY_BEAT_SCHEDULE["cost-rollups"] = {"task": "broker.costs.tasks.roll_up", "schedule": ROLLUP_INTERVAL_SECONDS}
CELERY_BEAT_SCHEDULE["pending-seconds-rollup"] = {
    "task": "broker.metrics.tasks.roll_up",
    "schedule": ROLLUP_INTERVAL_SECONDS,
}
# Retention (broker/cycle/retention.py), in days; 0 keeps forever. A cycle writes a SchedulingCycle row
# every few seconds (~17,000 a day); the latest cycle is always kept.
CYCLE_RETENTION_DAYS = envint("CYCLE_RETENTION_DAYS", "14")
# The explanation history and state transitions of workloads that ended (Succeeded, Failed, Cancelled)
# this long ago. Off by default: the cost of pending work (broker/costs/pending.py) is rebuilt from them,
# so a finance window older than this leaves out the workloads whose history is gone. The audit log,
# allocations (costs) and capacity samples are never pruned.
HISTORY_RETENTION_DAYS = envint("HISTORY_RETENTION_DAYS", "0")

# The simulated executor's clock runs this many times faster than the wall clock.
SIMULATION_SPEED = envfloat("SIMULATION_SPEED", "60")
# The trace replay submits jobs this many times more often than Philly did (see broker/cycle/replay.py).
REPLAY_DENSITY = envfloat("REPLAY_DENSITY", "6")
EXECUTOR = os.getenv("EXECUTOR", "simulated")
# A preemption victim keeps its devices this many seconds (simulated time under the simulated executor,
# so SIMULATION_SPEED times shorter on the wall clock) while it shuts down, before it is requeued.
EVICTION_GRACE_SECONDS = envfloat("EVICTION_GRACE_SECONDS", "10")
# A pending workload's stored explanation is rewritten only when its content changes; an estimated start
# that moved by less than this many seconds is not a change (it drifts with the cycle's clock).
EXPLANATION_ESTIMATE_TOLERANCE_SECONDS = envfloat("EXPLANATION_ESTIMATE_TOLERANCE_SECONDS", "60")
DEMO_REPLAY = envbool("DEMO_REPLAY", "False")

# The Kubernetes bridge (broker/kube/): off in the embedded default. On, `manage.py kube_sync` mirrors the
# cluster's inventory and PodGroups, and Celery beat runs the applier that binds what the cycle admits.
KUBE_ENABLED = envbool("KUBE_ENABLED", "False")
# How to reach the API server: an explicit URL (no credentials), else KUBECONFIG (the client reads it),
# else the pod's service account (KUBE_IN_CLUSTER).
KUBE_API_URL = os.getenv("KUBE_API_URL", "")
KUBE_IN_CLUSTER = envbool("KUBE_IN_CLUSTER", "False")
KUBE_CLUSTER_NAME = os.getenv("KUBE_CLUSTER_NAME", "kubernetes")
# Pods with this schedulerName are the broker's to bind.
KUBE_SCHEDULER_NAME = os.getenv("KUBE_SCHEDULER_NAME", "capacity-broker")
# Topology levels, coarse to fine, each `level=node label key` (Kueue's Topology levels).
KUBE_TOPOLOGY_LABELS = os.getenv(
    "KUBE_TOPOLOGY_LABELS", "block=cloud.provider.com/topology-block,rack=cloud.provider.com/topology-rack"
)
# A PodGroup's queue: this label on it, else its namespace's name; its resource class: this label.
KUBE_QUEUE_LABEL = os.getenv("KUBE_QUEUE_LABEL", "broker.capacity.io/queue")
KUBE_RESOURCE_CLASS_LABEL = os.getenv("KUBE_RESOURCE_CLASS_LABEL", "broker.capacity.io/resource-class")
# A DeviceClass first seen in the cluster is priced at this per device-hour until an operator sets one.
KUBE_DEFAULT_DEVICE_PRICE = os.getenv("KUBE_DEFAULT_DEVICE_PRICE", "0")
# Each watch request ends after this many seconds and is renewed from the last resourceVersion.
KUBE_WATCH_TIMEOUT_SECONDS = envint("KUBE_WATCH_TIMEOUT_SECONDS", "300")
# The sync is unhealthy once no list, event or bookmark has arrived for this long.
KUBE_SYNC_STALE_SECONDS = envfloat("KUBE_SYNC_STALE_SECONDS", "120")
# Attempts of one API write that meets 409 Conflict (re-read, then retried) before the applier gives up.
KUBE_CONFLICT_RETRIES = envint("KUBE_CONFLICT_RETRIES", "5")
if KUBE_ENABLED:
    CELERY_BEAT_SCHEDULE["kube-applier"] = {
        "task": "broker.kube.tasks.apply_outbox",
        "schedule": CYCLE_INTERVAL_SECONDS,
    }
if DEMO_REPLAY:
    # Celery mode's Philly replay; the embedded default replays inside `manage.py serve` instead.
    CELERY_BEAT_SCHEDULE["philly-replay"] = {
        "task": "broker.cycle.tasks.replay_tick",
        "schedule": CYCLE_INTERVAL_SECONDS,
    }
TRACES_DIR = Path(os.getenv("TRACES_DIR", BASE_DIR.parent / "shared" / "data" / "traces"))
BACKFILL_WAIT_SECONDS = envfloat("BACKFILL_WAIT_SECONDS", "600")
# Waiting gangs, first in line first, whose planned start work behind them may not delay (Slurm's
# bf_max_job_test for backfill); 1 = the head of the line only.
BACKFILL_DEPTH = int(os.getenv("BACKFILL_DEPTH", "4"))
# Estimated starts are simulated for the first this many waiting workloads in line (Slurm's
# bf_max_job_test); the rest say they were not estimated.
ESTIMATE_QUEUE_DEPTH = int(os.getenv("ESTIMATE_QUEUE_DEPTH", "1000"))
# Protection from thrashing (issue 31): a workload runs at least this many seconds after each (re)start
# before any rule may preempt it, and is never preempted more than this many times (0 = no bound).
PREEMPTION_MIN_RUNTIME_SECONDS = envfloat("PREEMPTION_MIN_RUNTIME_SECONDS", "0")
PREEMPTION_MAX_PER_WORKLOAD = envint("PREEMPTION_MAX_PER_WORKLOAD", "3") or None
# Preemptive shortest-remaining-first among equal priorities: a pending workload may preempt preemptible
# work of its priority in its cohort whose remaining device-time is at least this many times its own
# (unset: off). And shortest-first order within a priority, aged by this many seconds (unset: by age).
SHORTER_REMAINING_FACTOR = envfloat("SHORTER_REMAINING_FACTOR", "0") or None
SHORTEST_FIRST_AGING_SECONDS = envfloat("SHORTEST_FIRST_AGING_SECONDS", "0") or None
# The oldest this many waiting gangs of at least LARGE_GANG_DEVICES devices keep a planned start and
# domain wherever they stand in line: no admission or preemption may delay them (0 = only BACKFILL_DEPTH).
PROTECTED_LARGE_GANGS = int(os.getenv("PROTECTED_LARGE_GANGS", "2"))
LARGE_GANG_DEVICES = int(os.getenv("LARGE_GANG_DEVICES", "32"))
# Once an inventory of at least this many devices has been read (and indexed), a cycle ends by moving
# everything then alive out of the cyclic collector's reach (gc.freeze): at 100k devices its full
# passes over the kept inventory paused the process for 300 ms at a time. 0 = never.
GC_FREEZE_MIN_DEVICES = int(os.getenv("GC_FREEZE_MIN_DEVICES", "10000"))
# The same after a cycle whose load kept new sets of at least this many running and pending workload
# records (any change in that work renews its set: a new dict and result holding every record), walked by
# every full pass too (50-150 ms at 100k devices). 0 = never.
GC_FREEZE_MIN_RECORDS = int(os.getenv("GC_FREEZE_MIN_RECORDS", "10000"))
APPROVAL_ESCALATION_SECONDS = envfloat("APPROVAL_ESCALATION_SECONDS", "86400")
# GET /metrics takes `Authorization: Bearer <this>` when set, or an operator's, finance's or staff session;
# METRICS_PUBLIC=True opens it to anyone (its figures name every team's pending work).
METRICS_TOKEN = os.getenv("METRICS_TOKEN", "")
METRICS_PUBLIC = envbool("METRICS_PUBLIC", "False")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Failed logins (the login page, the API's token endpoint, the admin) are counted per username and address;
# after LOGIN_FAILURE_LIMIT of them that pair is refused for LOGIN_LOCKOUT_MINUTES, or until an operator
# lifts it on /governance/lockouts/ (broker.governance.lockouts; both audited).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", "5")
AXES_COOLOFF_TIME = timedelta(minutes=envfloat("LOGIN_LOCKOUT_MINUTES", "15"))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "broker.governance.lockouts.lockout_response"
AXES_VERBOSE = False

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.getenv("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Plotly's JavaScript ships inside the plotly package: serve it from there (no CDN, no copy to keep in step).
PLOTLY_JS_DIR = Path(plotly.__file__).resolve().parent / "package_data"
STATICFILES_DIRS = [BASE_DIR / "static", ("vendor", PLOTLY_JS_DIR)]
STATIC_ROOT = Path(os.getenv("STATIC_ROOT", DATA_DIR / "staticfiles"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = True


def vendor_cache_headers(headers, path, url):
    """Plotly changes only with the plotly package: browsers keep it a day instead of WhiteNoise's minute."""
    if "/vendor/" in url and not DEBUG:
        headers["Cache-Control"] = "public, max-age=86400"


WHITENOISE_ADD_HEADERS_FUNCTION = vendor_cache_headers

# The largest request body any page or API call takes (the largest real one, a resource class with its
# entitled teams, is a few KB); a larger one is answered 413 from its Content-Length before it is read.
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("MAX_REQUEST_BODY_BYTES", str(1024 * 1024))

# Content-Security-Policy on every response (django-csp): scripts only from this host, or inline with this
# response's nonce (templates write nonce="{{ CSP_NONCE }}"); nothing framed, posted or loaded elsewhere.
# Styles may be inline: Plotly and the admin set style attributes, which cannot carry a nonce.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

REST_FRAMEWORK = {
    # JSON, and the form encoding of the browsable API's forms. No multipart: the API takes no files, and
    # daphne (Twisted) answers a malformed multipart body itself with a bare 400 before Django sees it.
    "DEFAULT_PARSER_CLASSES": ["broker.api.parsers.BoundedJSONParser", "broker.api.parsers.NulFreeFormParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "broker.api.filters.KeyedSearchFilter",
    ],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "broker.api.negotiation.FormatCheckedNegotiation",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": envint("API_PAGE_SIZE", "50"),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Capacity Broker API",
    "DESCRIPTION": "Brokers scarce AI accelerators: inventory, policy, workloads, explanations, costs.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The error answers every operation can give (400, 403, 404, 409), which views do not declare.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "broker.api.schema.document_errors"],
}

if PRODUCTION:
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "True")
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "31536000")
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
    # axes logs every login and logout at INFO; its warnings (failures, lockouts) stay.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}
