"""A job's life: its row in SQL (rows), specs, plans and rate limits at submission, dispatch and
routing to a worker's queue, its event stream, and the context a workflow runs a job in.  Knows
nothing of Celery (it sends by a callable) or HTTP."""
