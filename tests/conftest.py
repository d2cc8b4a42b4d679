"""The tests' fixtures live in ``tests/support``: the session broker and topic names in
``fixtures.py``, the determinism tests' seeded topic and offline reference in ``determinism.py``."""

pytest_plugins = ["support.fixtures", "support.determinism"]
