#!/usr/bin/env python3
"""The lab's fixture upstream over HTTP: a directory laid out like real URLs.

Usage: fixture-server.py ROOT ADDRESS PORT [MORE_ROOT...]

A path is looked up in ROOT, then in each MORE_ROOT (real components built
by `ci/lab prepare`, kept apart from the fixture so each is cached on its
own).

Serves GET and HEAD with single-range requests (`bytes=N-M`, `bytes=N-`),
the way upstream CDNs do, so the builder's resume can be tested. Lab-only
control endpoints under /_lab/:

  GET  /_lab/stats        {"requests": N, "paths": {path: count}, "ranged": {path: count}}
                          (control calls not counted)
  POST /_lab/stats/reset  zero the counters
  POST /_lab/fault        JSON {"path": P, "cut_after": BYTES} closes the next GET
                          of P after BYTES bytes; {"path": P, "status": 503, "times": N}
                          answers the next N GETs of P with that status.
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

ROOTS = [os.path.realpath(r) for r in [sys.argv[1]] + sys.argv[4:]]


def resolve(path):
    """The file serving `path`, or None; never outside a root."""
    for root in ROOTS:
        full = os.path.realpath(os.path.join(root, path.lstrip("/")))
        if full.startswith(root + os.sep) and os.path.isfile(full):
            return full
    return None
LOCK = threading.Lock()
STATS = {"requests": 0, "paths": {}, "ranged": {}}
FAULTS = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        path = urlparse(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with LOCK:
            if path == "/_lab/stats/reset":
                STATS["requests"], STATS["paths"], STATS["ranged"] = 0, {}, {}
                return self._json(200, STATS)
            if path == "/_lab/fault":
                FAULTS[body["path"]] = dict(body, times=body.get("times", 1))
                return self._json(200, {"ok": True})
        self._json(404, {"error": "unknown control endpoint"})

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        if urlparse(self.path).path == "/_lab/stats":
            with LOCK:
                return self._json(200, STATS)
        self._serve(head=False)

    def _serve(self, head):
        path = unquote(urlparse(self.path).path)
        with LOCK:
            STATS["requests"] += 1
            STATS["paths"][path] = STATS["paths"].get(path, 0) + 1
            if self.headers.get("Range"):
                STATS["ranged"][path] = STATS["ranged"].get(path, 0) + 1
            fault = FAULTS.get(path)
            if fault and not head:
                fault["times"] -= 1
                if fault["times"] <= 0:
                    del FAULTS[path]
        full = resolve(path)
        if full is None:
            return self._json(404, {"error": "not found", "path": path})
        if fault and not head and "status" in fault:
            return self._json(fault["status"], {"error": "injected fault"})
        size = os.path.getsize(full)
        start, end, code = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[6:].partition("-")
            if a.isdigit():
                start = int(a)
                end = int(b) if b.isdigit() else size - 1
                if start >= size or end < start:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                end, code = min(end, size - 1), 206
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if code == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head:
            return
        cut = fault.get("cut_after") if fault else None
        sent = 0
        with open(full, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                chunk = f.read(min(65536, left))
                if not chunk:
                    break
                if cut is not None and sent + len(chunk) > cut:
                    self.wfile.write(chunk[: cut - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                left -= len(chunk)


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer((sys.argv[2], int(sys.argv[3])), Handler).serve_forever()
