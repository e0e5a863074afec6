"""Celery wiring for setflow (arrives with the workers issue)."""
