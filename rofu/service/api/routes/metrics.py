"""GET /metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import MetricsDep

router = APIRouter(route_class=JsonRoute, tags=["health"])


@router.get("/metrics", response_class=Response)
async def metrics(service_metrics: MetricsDep) -> Response:
    """Request counts and latencies, batch sizes, selections, rewards (by outcome; by arm
    and policy), the uniform baseline's IPS sums, model version/age."""
    return Response(generate_latest(service_metrics.registry), media_type=CONTENT_TYPE_LATEST)
