#!/usr/bin/env python3
"""Pushes the fixture's image layouts into a registry, byte for byte.

Usage: push.py HOST:PORT IMAGES_TXT

Each line of IMAGES_TXT is `REFERENCE LAYOUT_DIR INDEX_DIGEST`. The image is
pushed as `HOST:PORT/<upstream host>/<repository>:<tag>`, so the fixture
registry holds names the way the mirror rewriting expects. Manifests are
sent as stored, with their own media type: digests never change, and the
one Docker schema2 image stays schema2 (skopeo's oci: transport refuses
Docker media types inside a layout, so it cannot push that one).
"""
import json
import os
import sys
import urllib.request


def request(method, url, data=None, headers=None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def blob_path(layout, digest):
    return os.path.join(layout, "blobs", "sha256", digest.split(":", 1)[1])


def push_blob(base, repo, layout, digest):
    status, _, _ = request("HEAD", f"{base}/v2/{repo}/blobs/{digest}")
    if status == 200:
        return
    status, headers, body = request("POST", f"{base}/v2/{repo}/blobs/uploads/")
    if status != 202:
        sys.exit(f"push.py: starting an upload of {digest} to {repo} failed: {status} {body[:200]!r}")
    loc = headers["Location"]
    if loc.startswith("/"):
        loc = base + loc
    sep = "&" if "?" in loc else "?"
    with open(blob_path(layout, digest), "rb") as f:
        data = f.read()
    status, _, body = request("PUT", f"{loc}{sep}digest={digest}", data, {"Content-Type": "application/octet-stream"})
    if status != 201:
        sys.exit(f"push.py: uploading {digest} to {repo} failed: {status} {body[:200]!r}")


def push_manifest(base, repo, layout, desc, tag=None):
    with open(blob_path(layout, desc["digest"]), "rb") as f:
        raw = f.read()
    doc = json.loads(raw)
    for child in doc.get("manifests", []):
        push_manifest(base, repo, layout, child)
    for b in [doc.get("config")] + doc.get("layers", []):
        if b:
            push_blob(base, repo, layout, b["digest"])
    ref = tag or desc["digest"]
    status, _, body = request("PUT", f"{base}/v2/{repo}/manifests/{ref}", raw, {"Content-Type": desc["mediaType"]})
    if status != 201:
        sys.exit(f"push.py: putting manifest {ref} of {repo} failed: {status} {body[:300]!r}")


def main():
    base = "http://" + sys.argv[1]
    for line in open(sys.argv[2]):
        if not line.strip():
            continue
        ref, layout, digest = line.split()
        name, tag = ref.rsplit(":", 1)
        with open(os.path.join(layout, "index.json")) as f:
            top = json.load(f)["manifests"][0]
        assert top["digest"] == digest, f"{ref}: index.json does not point at {digest}"
        push_manifest(base, name, layout, top, tag)


main()
