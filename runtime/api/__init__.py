"""The HTTP API (FastAPI): sessions, jobs, their events (SSE), health, metrics, the web page.
`create_app(settings, send=...)` builds it; `setflow serve` runs it under uvicorn."""
