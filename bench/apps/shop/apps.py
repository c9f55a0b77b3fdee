"""The shop app's config."""

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "bench.apps.shop"
    label = "shop"
