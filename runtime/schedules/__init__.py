"""Schedules: a tenant's cron jobs (crud), their cron expressions (cron) and templates
(templates), and the ticker every worker runs and one leads (ticker), which claims each tick and
submits its jobs (claims) through runtime/jobs' Dispatcher.  Knows nothing of HTTP or Celery."""
