#!/usr/bin/env python3
"""Lab fixture: a small Debian archive for bookworm, amd64 and arm64.

Usage: debian-archive.py MIRROR WORK OUT KEY_OUT

The packages kubexm's bundles carry (haproxy, keepalived, conntrack, socat,
ebtables, ethtool, iptables, ipset) and everything they depend on are fetched
once with `apt-get download` (the ordinary client, with a private apt
configuration pointing at MIRROR's `bookworm main`; nothing of this machine's
apt state is touched). Two lab-made packages are added to show a dependency
that cannot be resolved: kubexm-lab-broken depends on kubexm-lab-middle, which
depends on kubexm-lab-absent (not in the archive).

OUT becomes a mirror: pool/ with the .debs at the paths the index names,
dists/bookworm/main/binary-{amd64,arm64}/Packages(.gz), and dists/bookworm/
Release and InRelease, signed by a lab archive key made here (never a real
Debian key). The key's public half is written to KEY_OUT, armored.
"""

import gzip
import hashlib
import os
import shutil
import subprocess
import time
import sys

PACKAGES = ["haproxy", "keepalived", "conntrack", "socat", "ebtables", "ethtool", "iptables", "ipset"]
ARCHES = ["amd64", "arm64"]
CODENAME = "bookworm"

mirror, work, out, key_out = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
apt = os.path.join(work, "apt")
for d in ["lists/partial", "cache/archives/partial", "dl"]:
    os.makedirs(os.path.join(apt, d), exist_ok=True)
with open(os.path.join(apt, "sources.list"), "w") as f:
    f.write(f"deb [arch={','.join(ARCHES)} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {CODENAME} main\n")
open(os.path.join(apt, "status"), "a").close()
OPTS = [
    f"-oDir::Etc::sourcelist={apt}/sources.list", "-oDir::Etc::sourceparts=-",
    f"-oDir::State::Lists={apt}/lists", f"-oDir::State::status={apt}/status",
    f"-oDir::Cache={apt}/cache", "-oAPT::Architecture=amd64",
    "-oAPT::Architectures::=amd64", "-oAPT::Architectures::=arm64", "-oDebug::NoLocking=1",
]


def run(*args, **kw):
    return subprocess.run(list(args), check=True, stdout=subprocess.PIPE, text=True, **kw).stdout


run("apt-get", *OPTS, "-qq", "update")
names = set()
for arch in ARCHES:
    deps = run("apt-cache", *OPTS, "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
               "--no-breaks", "--no-replaces", "--no-enhances", *[f"{p}:{arch}" for p in PACKAGES])
    for line in deps.splitlines():
        if line and not line.startswith(" ") and "<" not in line:
            names.add(line.strip())
names = sorted(names)


def stanzas(text):
    for block in text.strip().split("\n\n"):
        if block.strip():
            fields = {}
            key = None
            for line in block.splitlines():
                if line.startswith((" ", "\t")) and key:
                    fields[key] += "\n" + line
                elif ":" in line:
                    key, _, value = line.partition(":")
                    fields[key] = value.strip()
            yield block.strip(), fields


index = {}  # (package, arch) -> (stanza text, fields)
for text, fields in stanzas(run("apt-cache", *OPTS, "show", "--no-all-versions", *names)):
    index[(fields["Package"], fields["Architecture"])] = (text, fields)

# Fetch every .deb once with apt-get download; match them to the index by sha256.
dl = os.path.join(apt, "dl")
want = [f"{p}:{a}" if a != "all" else p for (p, a) in index]
missing = [w for w, (_, f) in zip(want, index.values()) if not os.path.exists(os.path.join(dl, os.path.basename(f["Filename"])))]
if missing:
    run("apt-get", *OPTS, "-qq", "download", *missing, cwd=dl)
by_sha = {}
for name in os.listdir(dl):
    with open(os.path.join(dl, name), "rb") as f:
        by_sha[hashlib.sha256(f.read()).hexdigest()] = os.path.join(dl, name)
shutil.rmtree(out, ignore_errors=True)
for text, fields in index.values():
    src = by_sha.get(fields["SHA256"])
    if not src:
        sys.exit(f"debian-archive: apt-get download gave no file with the sha256 of {fields['Package']} {fields['Version']}")
    dest = os.path.join(out, fields["Filename"])
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(src, dest)
    # Name the downloaded file as the pool does, so a re-run finds it.
    pool_name = os.path.join(dl, os.path.basename(fields["Filename"]))
    if src != pool_name:
        os.replace(src, pool_name)
        by_sha[fields["SHA256"]] = pool_name

# Lab-made packages for an unresolvable chain, built with dpkg-deb.
for pkg, dep in [("kubexm-lab-broken", "kubexm-lab-middle"), ("kubexm-lab-middle", "kubexm-lab-absent (>= 1.0)")]:
    root = os.path.join(work, "build", pkg)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "DEBIAN"))
    control = (f"Package: {pkg}\nVersion: 1.0\nArchitecture: all\nMaintainer: kubexm lab <lab@kubexm.invalid>\n"
               f"Priority: optional\nDepends: {dep}\nDescription: kubexm lab package with a dependency that cannot be met\n")
    with open(os.path.join(root, "DEBIAN", "control"), "w") as f:
        f.write(control)
    rel = f"pool/main/k/{pkg}/{pkg}_1.0_all.deb"
    dest = os.path.join(out, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    run("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, dest, env={**os.environ, "SOURCE_DATE_EPOCH": "0"})
    data = open(dest, "rb").read()
    text = control.strip() + f"\nFilename: {rel}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}"
    index[(pkg, "all")] = (text, {"Package": pkg, "Architecture": "all"})

dist = os.path.join(out, "dists", CODENAME)
sums = []
for arch in ARCHES:
    entries = sorted((k, v[0]) for k, v in index.items() if k[1] in (arch, "all"))
    body = ("\n\n".join(t for _, t in entries) + "\n").encode()
    rel = f"main/binary-{arch}"
    os.makedirs(os.path.join(dist, rel))
    gz = gzip.compress(body, mtime=0)
    for name, data in [("Packages", body), ("Packages.gz", gz)]:
        with open(os.path.join(dist, rel, name), "wb") as f:
            f.write(data)
        sums.append(f" {hashlib.sha256(data).hexdigest()} {len(data):>16} {rel}/{name}")
release = (
    "Origin: kubexm-lab\nLabel: kubexm-lab\nSuite: stable\nCodename: bookworm\n"
    "Date: Sat, 10 Jun 2023 00:00:00 UTC\nArchitectures: amd64 arm64\nComponents: main\n"
    "Description: kubexm lab fixture archive (a subset of bookworm main)\nSHA256:\n" + "\n".join(sums) + "\n"
)
with open(os.path.join(dist, "Release"), "w") as f:
    f.write(release)

# The lab archive key, made once per fixture build.
gnupg = os.path.join(work, "gnupg")


def stop_agent():
    # gpg starts an agent per home directory; one left by an earlier build
    # (its home since deleted) makes the next key generation fail.
    if os.path.isdir(gnupg):
        subprocess.run(["gpgconf", "--homedir", gnupg, "--kill", "gpg-agent"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


stop_agent()
shutil.rmtree(gnupg, ignore_errors=True)
os.makedirs(gnupg, mode=0o700)
g = ["gpg", "--batch", "--quiet", "--homedir", gnupg, "--pinentry-mode", "loopback", "--passphrase", ""]
try:
    for attempt in range(3):
        try:
            run(*g, "--quick-gen-key", "kubexm lab archive signing key <lab@kubexm.invalid>", "rsa4096", "sign", "never")
            break
        except subprocess.CalledProcessError:
            if attempt == 2:
                raise
            stop_agent()
            time.sleep(1)
    run(*g, "--yes", "--clearsign", "--digest-algo", "SHA256", "-o", os.path.join(dist, "InRelease"), os.path.join(dist, "Release"))
    with open(key_out, "w") as f:
        f.write(run(*g, "--armor", "--export"))
finally:
    stop_agent()
print(f"debian-archive: {len(index)} packages for {', '.join(ARCHES)} in {out}")
