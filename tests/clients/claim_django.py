"""A worker's claim with Django's ORM, connected as a Django app is: its settings from the ``PG*`` variables.

filter().first() then update() can claim a job twice; ``--skip-locked`` reads with
select_for_update(skip_locked=True) (the cure).
"""

import sys

import django_env

django_env.setup()

from django.db import models, transaction  # noqa: E402  (after settings, as Django asks)
from django.db.models import F  # noqa: E402


class Job(models.Model):  # type: ignore[misc]  # Django has no stubs here
    status = models.TextField()
    claims = models.IntegerField()

    class Meta:
        app_label = "queue"
        db_table = "jobs"


with transaction.atomic():
    pending = Job.objects.filter(status="pending").order_by("id")
    if "--skip-locked" in sys.argv:
        pending = pending.select_for_update(skip_locked=True)
    job = pending.first()
    if job is not None:
        Job.objects.filter(pk=job.pk).update(status="claimed", claims=F("claims") + 1)
