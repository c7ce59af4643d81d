"""The service itself: ``GET /healthz`` (public: a container's health check) and
``GET /metrics`` (Prometheus text format, :mod:`worker.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from sandbox import __version__

from .common import ERRORS
from .state import ServiceDep

router = APIRouter(tags=["service"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


@router.get("/metrics", response_class=Response, responses=ERRORS)
async def metrics_route(service: ServiceDep) -> Response:
    metrics = service.metrics
    return Response(metrics.render(), media_type=metrics.content_type)
