"""The withdrawal with Django's ORM, connected as a Django app is: its settings from the ``PG*`` variables.

get() then save() loses an update; ``--for-update`` reads with select_for_update() (the cure).
"""

import sys

import django_env

django_env.setup()

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
