"""A real OpenTelemetry trace collector (OTLP), for the end-to-end tests.

  otlp_receiver.py --grpc-port N [--http-port M] --out FILE [--delay-ms D]

Serves opentelemetry.proto.collector.trace.v1.TraceService/Export with grpcio
on 127.0.0.1:N and, with --http-port, OTLP/HTTP protobuf (POST /v1/traces)
on 127.0.0.1:M. Each span received is appended to FILE as one JSON line:

  trace_id, span_id, parent_span_id ("" for a root): hex
  name, kind (the proto's number: 1 internal, 2 server, 3 client, ...),
  start_ns, end_ns, status_code, scope (its name),
  attributes, resource: {key: value}, arrays as lists, maps as objects,
      bytes as hex
  received_ns: this process's time.time_ns() when the export arrived
  via: "grpc" or "http"
  headers: the export call's metadata or HTTP headers, names lowercased

An export's spans are written and flushed before it is answered; with
--delay-ms each export then waits D ms before answering, as a slow collector
does. Prints "ready" once every port listens, and nothing else; exits on
SIGTERM, or when the process that started it is gone.
"""
import argparse
import gzip
import json
import math
import os
import signal
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Read before the slow imports below: a parent that dies meanwhile would
# otherwise go unnoticed, its successor taken for it.
PARENT = os.getppid()

import grpc  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import (  # noqa: E402
    trace_service_pb2,
    trace_service_pb2_grpc,
)


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    value = getattr(v, kind)
    # JSON has no NaN or infinity: the test side's parser would refuse the line.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def attributes(key_values):
    return {kv.key: any_value(kv.value) for kv in key_values}


class Spans:
    """The output file. One lock keeps an export's lines together and lets
    an exit wait for a write under way."""

    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8")
        self.lock = threading.Lock()

    def record(self, request, via, headers, received_ns):
        lines = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(
                        json.dumps(
                            {
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "name": span.name,
                                "kind": span.kind,
                                "start_ns": span.start_time_unix_nano,
                                "end_ns": span.end_time_unix_nano,
                                "attributes": attributes(span.attributes),
                                "status_code": span.status.code,
                                "resource": resource,
                                "scope": scope_spans.scope.name,
                                "received_ns": received_ns,
                                "via": via,
                                "headers": headers,
                            }
                        )
                        + "\n"
                    )
        if lines:
            with self.lock:
                self.file.write("".join(lines))
                self.file.flush()


def header_map(pairs):
    headers = {}
    for name, value in pairs:
        if isinstance(value, bytes):  # gRPC's "-bin" metadata
            value = value.hex()
        name = name.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans, delay):
        self.spans = spans
        self.delay = delay

    def Export(self, request, context):
        received_ns = time.time_ns()
        headers = header_map(context.invocation_metadata())
        self.spans.record(request, "grpc", headers, received_ns)
        time.sleep(self.delay)
        return trace_service_pb2.ExportTraceServiceResponse()


def http_handler(spans, delay):
    class Handler(BaseHTTPRequestHandler):
        # Exporters keep their connection for the next export.
        protocol_version = "HTTP/1.1"

        def answer(self, status, body=b"", content_type="text/plain"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def body(self):
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                body = b"".join(chunks)
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            return body

        def do_POST(self):
            received_ns = time.time_ns()
            body = self.body()
            if urlsplit(self.path).path != "/v1/traces":
                self.answer(404)
                return
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type.lower() != "application/x-protobuf":
                # OTLP/JSON spells ids in hex where protobuf's JSON mapping
                # wants base64: refused rather than half understood.
                self.answer(415, b"application/x-protobuf only")
                return
            try:
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            except DecodeError as e:
                self.answer(400, str(e).encode())
                return
            spans.record(request, "http", header_map(self.headers.items()), received_ns)
            time.sleep(delay)
            response = trace_service_pb2.ExportTraceServiceResponse()
            self.answer(200, response.SerializeToString(), "application/x-protobuf")

        def log_message(self, format, *args):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--out", required=True)
    parser.add_argument("--delay-ms", type=int, default=0)
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    spans = Spans(args.out)

    def stop(*_):
        # Not in the middle of an export's lines.
        spans.lock.acquire()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    # grpcio sets SO_REUSEPORT by default: two receivers told one port would
    # both bind it and share its exports.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        options=[("grpc.so_reuseport", 0)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
        TraceService(spans, delay), server
    )
    server.add_insecure_port(f"127.0.0.1:{args.grpc_port}")
    server.start()
    if args.http_port is not None:
        httpd = ThreadingHTTPServer(
            ("127.0.0.1", args.http_port), http_handler(spans, delay)
        )
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print("ready", flush=True)

    # A test process killed outright never stops its receiver: its death
    # shows here as a new parent.
    while os.getppid() == PARENT:
        time.sleep(0.5)
    stop()


if __name__ == "__main__":
    sys.exit(main())
