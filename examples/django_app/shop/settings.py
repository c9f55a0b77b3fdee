"""Settings for the example: one SQLite file, forq's Redis from FORQ_REDIS_URL."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
# an example's key; a real project reads it from the environment or a file
SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["shop"]
ROOT_URLCONF = "shop.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "shop.sqlite3")),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = True

FORQ_REDIS_URL = os.environ.get("FORQ_REDIS_URL", "redis://127.0.0.1:6379/0")
FORQ_QUEUE = os.environ.get("SHOP_QUEUE", "shop")
