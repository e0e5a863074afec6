"""Webhooks for job endings: the outbox a job's ending writes in its own transaction (outbox), a
tenant's endpoints (endpoints), the sender every worker runs (sender), its bounded HTTP client that
reaches public addresses only (transport), and the signing secrets sealed at rest (sealed).
Below runtime/jobs, which writes the outbox; knows nothing of jobs, workers or routes."""
