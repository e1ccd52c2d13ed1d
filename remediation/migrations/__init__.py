"""Alembic migrations of the action store (``remediation/store.py``), run by ``ActionStore.migrate``.

Shipped inside the package (no ``alembic.ini``): the store builds the Alembic config in
code and hands its own connection to ``env.py``.
"""
