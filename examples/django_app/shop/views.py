"""Orders: the row and its receipt job commit together, or neither happens."""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from forq import JobNotFound, Queue
from forq.django import enqueue_on_commit

from shop.models import Order


@cache
def queue() -> Queue:
    """One Queue (and its connection pool) per process, opened on first use."""
    return Queue(settings.FORQ_QUEUE, url=settings.FORQ_REDIS_URL)


class Refused(Exception):
    pass


@csrf_exempt  # an API endpoint of the example, not a form
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    email = request.POST.get("email", "")
    job_id = None
    try:
        with transaction.atomic():
            order = Order.objects.create(email=email)
            job_id = enqueue_on_commit(queue(), "shop.send_receipt", order.id, email)
            if not email.endswith("@example.com"):
                raise Refused(f"we only ship to example.com, not {email!r}")  # rolls back
    except Refused as exc:
        # the order is gone and its receipt job was never sent
        return JsonResponse({"error": str(exc), "job": job_id}, status=400)
    return JsonResponse({"order": order.id, "job": job_id})


@require_GET
def job_status(request: HttpRequest, job_id: str) -> JsonResponse:
    try:
        job = queue().get(job_id)
    except JobNotFound:
        return JsonResponse({"error": f"no job {job_id}"}, status=404)
    return JsonResponse({"state": job.state, "result": job.result})
