"""The lost update, written with Django's ORM: get() then save(), and its two cures.

Run it from the repository: python examples/code/withdraw_django.py
"""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        # pgrace hands each session its own connection to its scratch database: NAME is not used
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "bank"}},
        USE_TZ=True,
        TIME_ZONE="UTC",
    )
    django.setup()

from django.db import models, transaction
from django.db.models import F

import pgrace
from pgrace.drivers.code_django import session


class Account(models.Model):
    balance = models.IntegerField()

    class Meta:
        app_label = "bank"
        db_table = "accounts"


def withdraw() -> None:
    """The race: the ORM reads the balance, Python subtracts, save() writes it back."""
    with transaction.atomic():
        account = Account.objects.get(pk=1)
        account.balance -= 100
        account.save()


def withdraw_locked() -> None:
    """A cure: select_for_update() locks the row when it is read; the second withdrawal waits for it."""
    with transaction.atomic():
        account = Account.objects.select_for_update().get(pk=1)
        account.balance -= 100
        account.save()


def withdraw_f() -> None:
    """The other cure: F() makes the server subtract from the balance it holds, whatever was read."""
    with transaction.atomic():
        account = Account.objects.get(pk=1)
        account.balance = F("balance") - 100
        account.save()


SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


def main(server: Any = None) -> None:
    """Explore the race and both cures; show the timeline of the interleaving that loses 100."""
    for fn in (withdraw, withdraw_locked, withdraw_f):
        found = pgrace.explore_code({"alice": session(fn), "bob": session(fn)}, setup=SETUP, final=FINAL, server=server)
        covered = "every order covered" if found.complete else "not every order covered"
        print(f"{fn.__name__}: {found.run_count} runs, {covered}")
        for c in found.classes:
            print(f"  {c.count:3}  final {c.final[0]}  e.g. {' '.join(name for name, _ in c.statements)}")
        if fn is withdraw:
            from pgrace.render.text import render_text

            lost = next(c for c in found.classes if c.final[0] == ((400,),))
            print()
            print(render_text(found.replay(lost)))


if __name__ == "__main__":
    main()
