"""Example agents used by the jobs under ``jobs/``, the demo and the tests."""
