"""The lost update, written with the SQLAlchemy ORM: the race, and its cure (SELECT ... FOR UPDATE).

Run it: python examples/code/withdraw_sqlalchemy.py
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgrace
from pgrace.drivers.code_sqlalchemy import engine


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int]


def withdraw(conn: object) -> None:
    """The race: the ORM reads the balance, Python subtracts, the ORM writes it back."""
    with Session(engine(conn)) as session:
        account = session.get(Account, 1)
        assert account is not None
        account.balance -= 100
        session.commit()


def withdraw_locked(conn: object) -> None:
    """The cure: the row is locked when it is read (with_for_update), so the second withdrawal waits."""
    with Session(engine(conn)) as session:
        account = session.scalars(select(Account).where(Account.id == 1).with_for_update()).one()
        account.balance -= 100
        session.commit()


SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


def main(server: object = None) -> None:
    for fn in (withdraw, withdraw_locked):
        found = pgrace.explore_code({"alice": fn, "bob": fn}, setup=SETUP, final=FINAL, server=server)
        print(f"{fn.__name__}: {found.explored} interleavings")
        for c in found.classes:
            print(f"  {c.count:3}  final {c.final[0]}")


if __name__ == "__main__":
    main()
