"""The shop's admin: each model registered with a ModelAdmin, as apps do."""

from django.contrib import admin

from bench.apps.shop import models


@admin.register(models.Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("sku", "name", "price", "status", "category")
    list_filter = ("status", "category")
    search_fields = ("sku", "name")


@admin.register(models.Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "status", "total", "placed")
    list_filter = ("status",)


for model in (models.Category, models.Supplier, models.Customer, models.Address,
              models.OrderLine, models.Review):
    admin.site.register(model)
