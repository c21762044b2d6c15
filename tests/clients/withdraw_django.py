"""The withdrawal with Django's ORM, connected as a Django app is: its settings from the ``PG*`` variables.

get() then save() loses an update; ``--for-update`` reads with select_for_update() (the cure).
"""

import os
import sys

import django
from django.conf import settings

settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["PGDATABASE"],
            "USER": os.environ["PGUSER"],
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ["PGHOST"],
            "PORT": os.environ["PGPORT"],
        }
    },
    USE_TZ=True,
    TIME_ZONE="UTC",
)
django.setup()

from django.db import models, transaction  # noqa: E402  (after settings, as Django asks)


class Account(models.Model):  # type: ignore[misc]  # Django has no stubs here
    balance = models.IntegerField()

    class Meta:
        app_label = "bank"
        db_table = "accounts"


with transaction.atomic():
    accounts = Account.objects.select_for_update() if "--for-update" in sys.argv else Account.objects
    account = accounts.get(pk=1)
    account.balance -= 100
    account.save(update_fields=["balance"])
