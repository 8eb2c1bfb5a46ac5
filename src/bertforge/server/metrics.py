"""Prometheus metrics of one server, on prometheus-client, in a registry of its own (so that
several apps in one process, as in tests, never share or clash)."""

from __future__ import annotations

from typing import Any

# Batch sizes in tokens reach --max-batch-tokens; request durations span a millisecond to a minute.
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("bertforge_requests", "HTTP requests answered", ["path", "status"], registry=r)
        self.duration = Histogram("bertforge_request_duration_seconds", "time from request to answer", ["path"],
                                  registry=r)
        self.in_flight = Gauge("bertforge_requests_in_flight", "requests admitted and not yet answered", registry=r)
        self.queue = Gauge("bertforge_queue_size", "requests waiting for a batch", ["endpoint"], registry=r)
        self.batch_items = Histogram("bertforge_batch_size", "inputs per batch", ["endpoint"], buckets=ITEM_BUCKETS,
                                     registry=r)
        self.batch_tokens = Histogram("bertforge_batch_tokens", "tokens per batch", ["endpoint"],
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.tokens = Counter("bertforge_tokens", "input tokens processed", ["endpoint"], registry=r)
        self.rejected = Counter("bertforge_rejected_requests", "requests refused because the server was full",
                                registry=r)

    def observer(self, endpoint: str):
        """The callback a batcher calls once per batch."""
        def observe(items: int, tokens: int) -> None:
            self.batch_items.labels(endpoint).observe(items)
            self.batch_tokens.labels(endpoint).observe(tokens)
            self.tokens.labels(endpoint).inc(tokens)

        return observe

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def track(self, path: str, status: int, seconds: float) -> None:
        self.requests.labels(path, str(status)).inc()
        self.duration.labels(path).observe(seconds)


def route_label(scope: dict[str, Any], routes: list | None = None) -> str:
    """The route's template, not the raw path: unknown paths share one label, so scans cannot
    grow the metrics without bound. A request refused before routing (too large, wrong content type,
    no API key) is matched against `routes` here, so it counts under the route it was sent to."""
    route = scope.get("route") or matched_route(scope, routes or [])
    return getattr(route, "path", None) or "unmatched"


def matched_route(scope: dict[str, Any], routes: list) -> Any:
    """The route whose path and method match the request, if any."""
    from starlette.routing import Match

    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
    return None
