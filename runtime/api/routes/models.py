"""/v1/models: the models live workers host, in OpenAI's shape (what `client.models.list()` and
agent frameworks read), from what workers publish; the current model card's where no worker says
what it hosts (workers of an earlier version)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from runtime.api.deps import Svc, Tenant
from runtime.api.models import ERRORS
from runtime.api.services import Services
from runtime.errors import NotFound
from runtime.jobs.hosts import Hosts
from runtime.keys import model_name

router = APIRouter(prefix="/v1/models", tags=["models"])


def _models(svc: Services) -> list[dict[str, Any]]:
    live = Hosts(svc.client, svc.settings).live()
    names = sorted({h.model for h in live})
    if not names:
        card = svc.cards.current()
        names = [model_name(card.config.name)] if card is not None else []
    out = []
    for name in names:
        hosts = [h for h in live if h.model == name]
        out.append({"id": name, "object": "model", "created": 0, "owned_by": "setflow",
                    "setflow": {"numerics": sorted({h.numerics for h in hosts}),
                                "fingerprints": sorted({h.fingerprint for h in hosts}),
                                "default": name == (svc.settings.default_model or name)}})
    return out


@router.get("", responses=ERRORS)
def list_models(who: Tenant, svc: Svc) -> JSONResponse:
    return JSONResponse({"object": "list", "data": _models(svc)})


@router.get("/{model}", responses=ERRORS)
def get_model(model: Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$")], who: Tenant, svc: Svc) -> JSONResponse:
    for m in _models(svc):
        if m["id"] == model:
            return JSONResponse(m)
    raise NotFound(f"no worker hosts a model {model!r}")
