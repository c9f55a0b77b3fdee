"""A real application's import set, loaded as a worker process loads its app: Django
configured and set up with the contrib apps and an app of our own (`shop`) whose models
and admin are registered, then pandas and numpy, with a small lookup table built in
pandas at import as applications do.

Django, pandas and numpy are installed in the peers' venv (bench/.venv-peers,
`bench.peers.venv`), never needed by the tests: run from forq's venv (the fork server),
where some are missing, the peers' site-packages go at the *end* of sys.path, so that
forq's own packages (redis, Django if the tests' extras installed it, ...) still win.
"""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path

PEERS_VENV = Path(__file__).resolve().parent.parent / ".venv-peers"


def _peers_site_packages() -> str:
    return sysconfig.get_path("purelib", vars={"base": str(PEERS_VENV),
                                               "platbase": str(PEERS_VENV)})


if not all(importlib.util.find_spec(name) for name in ("django", "pandas", "numpy")):
    sys.path.append(_peers_site_packages())  # forq's venv: the peers' packages, after ours

import django  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only-not-secret",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.staticfiles",
            "bench.apps.shop",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True, "OPTIONS": {"context_processors": [
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages"]}}],
        ROOT_URLCONF="bench.apps.shop.urls",
        STATIC_URL="/static/",
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
django.setup()

import numpy  # noqa: E402
import pandas  # noqa: E402
from django.contrib import admin  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from bench.apps.shop import models  # noqa: E402

get_resolver().url_patterns  # noqa: B018 — the URLconf and admin views, as a first request loads them

# a lookup table built at import, as an app's reference data often is
PRICE_BANDS = pandas.DataFrame({"band": numpy.arange(100), "low": numpy.linspace(0, 990, 100),
                                "high": numpy.linspace(10, 1000, 100)}).set_index("band")

MODELS = [m.__name__ for m in models.ALL]
ADMIN_MODELS = len(admin.site._registry)
