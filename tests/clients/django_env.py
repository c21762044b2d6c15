"""Django set up as a Django app is, its database settings from the ``PG*`` variables pgrace sets."""

import os

import django
from django.conf import settings


def setup() -> None:
    """Configure the default database from ``PG*`` and start Django; models can be declared after it."""
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
