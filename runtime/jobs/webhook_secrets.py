"""Moved to runtime/webhooks/sealed.py; this name stays only for runtime/api/routes/responses.py's
import, and goes when that import moves."""

from runtime.webhooks.sealed import deployment_key

__all__ = ["deployment_key"]
