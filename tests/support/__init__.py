"""Helpers shared by the tests: imported as ``support.<module>`` (``tests/`` is on pytest's
``pythonpath``); the fixtures live in ``support.fixtures``, registered by ``tests/conftest.py``."""
