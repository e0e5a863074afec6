"""Celery only: the app, the thin task, the worker process's runtime, running a job, the
heartbeat and reaper threads, and launching worker processes (`setflow worker`, LocalCluster)."""
