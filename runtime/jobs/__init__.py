"""A job's life: its row in SQL (rows, over table), its spec at submission (kinds, specs,
params, payload; its plan: workflows.PLANS), its tenant's admission (fairness: rate limit and
fair share), dispatch and routing to a worker's queue (dispatch, routing, hosts and their model
cards), its event stream (events), and the context a workflow runs it in (context); what a job
reads of its tenant's data (datasets, conversations).  Knows nothing of Celery (it sends by a
callable) or HTTP."""
