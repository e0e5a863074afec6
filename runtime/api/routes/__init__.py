"""The API's routes, one module per resource: sessions, jobs, ops (health, metrics), page."""
