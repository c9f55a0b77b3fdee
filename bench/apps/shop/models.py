"""A shop's models: enough fields, relations, indexes and choices that Django builds
the metadata a real app's models carry."""

from django.conf import settings
from django.db import models


class Category(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(unique=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="children")

    class Meta:
        verbose_name_plural = "categories"
        ordering = ["name"]


class Supplier(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField()
    country = models.CharField(max_length=2)
    created = models.DateTimeField(auto_now_add=True)


class Product(models.Model):
    STATUS = [("draft", "Draft"), ("live", "Live"), ("retired", "Retired")]
    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=200, db_index=True)
    description = models.TextField(blank=True)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=10, choices=STATUS, default="draft")
    category = models.ForeignKey(Category, on_delete=models.PROTECT, related_name="products")
    supplier = models.ForeignKey(Supplier, null=True, on_delete=models.SET_NULL)
    tags = models.JSONField(default=list)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["status", "category"])]


class Customer(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    phone = models.CharField(max_length=30, blank=True)
    newsletter = models.BooleanField(default=False)


class Address(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="addresses")
    line1 = models.CharField(max_length=200)
    line2 = models.CharField(max_length=200, blank=True)
    city = models.CharField(max_length=100)
    postcode = models.CharField(max_length=20)
    country = models.CharField(max_length=2)


class Order(models.Model):
    STATUS = [("new", "New"), ("paid", "Paid"), ("shipped", "Shipped"),
              ("cancelled", "Cancelled")]
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    status = models.CharField(max_length=10, choices=STATUS, default="new")
    shipping = models.ForeignKey(Address, on_delete=models.PROTECT, related_name="+")
    total = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    placed = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-placed"]


class OrderLine(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    unit_price = models.DecimalField(max_digits=10, decimal_places=2)


class Review(models.Model):
    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="reviews")
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE)
    stars = models.PositiveSmallIntegerField()
    text = models.TextField(blank=True)


ALL = [Category, Supplier, Product, Customer, Address, Order, OrderLine, Review]
