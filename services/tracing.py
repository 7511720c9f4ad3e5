"""OpenTelemetry traces of a case across client -> coordinator -> sites (off by default).

One trace per case: the client's "case" span is the root; the coordinator's SubmitCase span,
its Analyse call to each site and each site's Analyse span are its descendants, joined by
W3C trace context in the gRPC metadata. The servers' and the coordinator's site-call spans
come from opentelemetry-instrumentation-grpc (interceptors, installed always: while no
tracer provider is set they make non-recording spans and send no context). The client's
span is made here (`case_span`), because the instrumentation's client interceptor turns a
response stream into a plain generator, and a case's stream must keep `.cancel()`.

What a span may carry: the gRPC method, status code, peer address, request class, cell
count, site name. Never a case id, a cell id (file names, accession numbers) or image bytes:
the instrumentation records none of the request, and `case_span` sets only those named.

The coordinator's own analysis of a case's cells (its Ray analysers) is one "analyse cells"
span under SubmitCase (`analysis_span`); `pathmaster query --trace-file/--trace-endpoint`
turns tracing on in the desktop client, so its "case" span joins the servers' spans.

`start_tracing(settings, service)` turns it on in a process (a [tracing] table: an OTLP
collector or a JSON-lines file), once per process; servers call it when they start.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from services.config import TracingTable

log = logging.getLogger("pathmaster.tracing")

TRACER_NAME = "pathmaster"
# The services whose calls are traced (health checks and reflection are not).
TRACED_SERVICES = ("pathmaster.v1.Coordinator", "pathmaster.v1.Site")
TRACED_CLIENT_METHODS = ("/pathmaster.v1.Site/Analyse",)  # the coordinator's calls to its sites

_lock = threading.Lock()
_provider = None


def start_tracing(settings: TracingTable, service: str):
    """Export this process's spans as `settings` say, naming the process `service`
    ("pathmaster-site", ...). Returns the SDK TracerProvider, or None when the exporter is
    "off" or tracing was already started in this process (the first settings stay)."""
    global _provider
    if settings.exporter == "off":
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    with _lock:
        if _provider is not None:
            log.warning("tracing already started in this process; [tracing] of %s ignored", service)
            return None
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings)))
        trace.set_tracer_provider(provider)
        _provider = provider
    log.info("tracing on: spans to %s", settings.endpoint if settings.exporter == "otlp" else settings.file)
    return provider


def _exporter(settings: TracingTable):
    """The span exporter the settings name: OTLP over gRPC, or one JSON object per line."""
    if settings.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.endpoint)
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    settings.file.parent.mkdir(parents=True, exist_ok=True)
    out = open(settings.file, "a", encoding="utf-8")  # noqa: SIM115 - the exporter's for the process's life
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def server_interceptors() -> list:
    """gRPC server interceptors that make a span per Coordinator/Site call, a child of the
    caller's span (from the call's metadata)."""
    from opentelemetry.instrumentation.grpc import filters, server_interceptor

    return [server_interceptor(filter_=filters.any_of(*(filters.service_name(s) for s in TRACED_SERVICES)))]


def traced_channel(channel):
    """`channel` with a client span per call to a site's Analyse (context in its metadata)."""
    from opentelemetry.instrumentation.grpc import client_interceptor, filters, grpcext

    methods = filters.any_of(*(filters.full_method_name(m) for m in TRACED_CLIENT_METHODS))
    # the instrumentation's own channel wrapper (its interceptor is not a grpc one); other
    # calls (health watches) pass through untouched
    return grpcext.intercept_channel(channel, client_interceptor(filter_=methods))


@contextlib.contextmanager
def analysis_span(cells: int):
    """A span for the coordinator's own analysis of a case's `cells` cells (a child of the
    SubmitCase span current in this thread). Carries the cell count only."""
    try:
        from opentelemetry import trace
    except ImportError:  # a coordinator without OpenTelemetry: nothing traced
        yield None
        return
    with trace.get_tracer(TRACER_NAME).start_as_current_span(
            "analyse cells", attributes={"pathmaster.cells": cells}) as span:
        yield span


def case_span(request_class: str, cells: int):
    """Start a client span for one case: (the span or None, the gRPC metadata [(key, value)]
    that carries its context; empty while tracing is off). End it with `end_span` when the
    case's stream ends."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # a client without OpenTelemetry: nothing traced
        return None, []
    span = trace.get_tracer(TRACER_NAME).start_span(
        "case", kind=trace.SpanKind.CLIENT,
        attributes={"pathmaster.request_class": request_class, "pathmaster.cells": cells})
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, list(carrier.items())


def end_span(span, call) -> None:
    """End a `case_span` span with the outcome of its finished gRPC `call`."""
    if span is not None:
        end_span_code(span, call.code())


def end_span_code(span, code) -> None:
    """End a `case_span` span with its call's final grpc.StatusCode `code`."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code.value[0] != 0:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
