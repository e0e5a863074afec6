"""A session's state and its turns: K/V segments and manifests in Redis (store, segments, kv,
writebehind), sessions and turns in SQL (records), and the engine that resumes a turn warm,
from Redis or recomputed.  Knows nothing of jobs, Celery or HTTP."""
