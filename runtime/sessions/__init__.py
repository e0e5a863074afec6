"""A session's state and its turns: K/V segments and manifests in Redis (store, with the
manifests' JSON state; segments, kv, writer), sessions and turns in SQL (records), one turn's
decoding (decoding), the engine that resumes a turn (engine) warm (warm), from Redis or
recomputed (resume), a tenant's event streams in its byte account (streams), turn metrics
(metrics), a session's delete and fork (lifecycle), Redis's memory ceiling against the budgets
(budget), and the in-process runner over a bare model (local).  Knows nothing of jobs, Celery
or HTTP."""
