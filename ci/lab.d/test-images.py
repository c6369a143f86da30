#!/usr/bin/env python3
"""The images Kubernetes' conformance tests pull, built for the lab.

Usage: test-images.py BIN COMPONENTS_FILES OUT DEBS

BIN holds what ci/lab.d/conformance-build made (BIN/<arch>/agnhost, nnp,
sample-apiserver); COMPONENTS_FILES the lab's etcd release; DEBS the lab's
Debian packages (busybox-static), with the test images' packages and their
dependencies downloaded once into DEBS/test-images/<arch> with apt-get. Writes one
OCI image layout per image under OUT and OUT/images.txt for push.py, under
the exact names e2e.test pulls (test/utils/image/manifest.go of v1.37.2),
amd64 and arm64:

  e2e-test-images/agnhost:2.66.1    /agnhost (built from its module), with Debian's dig, curl,
                                    nc (openbsd), ip, socat, getent, bash, dash as /bin/sh and
                                    busybox's applets for the rest (upstream: Alpine's)
  e2e-test-images/agnhost:2.55      the same program (2.66.1) under the older tag      [stand-in]
  e2e-test-images/nautilus:1.8      agnhost with nautilus.jpg and data.json (from the module)
  e2e-test-images/kitten:1.8        agnhost with kitten.jpg and data.json; Debian's os-release    [stand-in]
  e2e-test-images/busybox:1.37.0-2  Debian's busybox-static 1.35 and its applets, bash as /bin/sh   [stand-in]
  e2e-test-images/nginx:1.27.0-2    Debian's nginx-light 1.22                          [stand-in]
  e2e-test-images/glibc-dns-testing:2.1.1
                                    Debian bookworm with dnsutils, as upstream's (without its /coredns)
  e2e-test-images/nonewprivs:1.4    /usr/local/bin/nnp (setuid root, built from its module) on busybox, not Alpine
  e2e-test-images/sample-apiserver:1.29.2
                                    /sample-apiserver built from k8s.io/sample-apiserver v0.37.2
  etcd:3.7.0-0                      the lab's etcd (v3.6.16) under kubeadm's tag       [stand-in]

An image built from something other than upstream's source for that tag
carries the label `io.kubexm.lab.stand-in` saying what it is instead.
"""
import functools
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
images = __import__("images")  # noqa: E402: shares the layer and layout code

BIN, COMPONENTS, OUT, DEBS = sys.argv[1:5]
images.OUT, images.DEBS = OUT, DEBS
ARCHES = ["amd64", "arm64"]
E2E = "registry.k8s.io/e2e-test-images"
ETCD = "v3.6.16"
# Packages extracted without their maintainer scripts need none of these.
NOT_NEEDED = {"debconf", "cdebconf", "debconf-2.0", "dpkg", "install-info", "tar", "perl-base", "adduser",
              "init-system-helpers", "lsb-base", "libdebian-installer4", "libnewt0.52", "libslang2",
              "libtextwrap1", "sysvinit-utils", "systemd", "systemd-sysv", "iproute2-doc"}
_FIELDS = {}


def fields(pkg, arch):
    """Depends and Pre-Depends of pkg for arch (first alternative, no
    versions); None for a virtual package."""
    key = (pkg, arch)
    if key not in _FIELDS:
        r = subprocess.run(["apt-cache", "show", "--no-all-versions", f"{pkg}:{arch}"], capture_output=True, text=True)
        if r.returncode != 0:  # an arch-all package
            r = subprocess.run(["apt-cache", "show", "--no-all-versions", pkg], capture_output=True, text=True)
        out = r.stdout if r.returncode == 0 else ""
        if "Package:" not in out:  # a virtual package: what provides it is in the closure already
            _FIELDS[key] = None
            return None
        deps = []
        for line in out.splitlines():
            if line.startswith(("Depends:", "Pre-Depends:")):
                for d in line.split(":", 1)[1].split(","):
                    first = d.split("|")[0].strip()
                    deps.append(re.split(r"[\s(:]", first)[0])
        _FIELDS[key] = deps
    return _FIELDS[key]


def closure(pkgs, arch):
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        if p in seen or p in NOT_NEEDED:
            continue
        deps = fields(p, arch)
        if deps is None:
            continue
        seen.add(p)
        todo += deps
    return sorted(seen)


def debs(pkgs, arch):
    """The .deb files of pkgs and everything they depend on, downloaded once."""
    d = os.path.join(DEBS, "test-images", arch)
    os.makedirs(d, exist_ok=True)
    files = []
    for p in closure(pkgs, arch):
        found = [f for f in os.listdir(d) if f.startswith(f"{p}_") and f.endswith((f"_{arch}.deb", "_all.deb"))]
        if not found:
            r = subprocess.run(["apt-get", "download", "-qq", f"{p}:{arch}"], cwd=d)
            if r.returncode != 0:  # an arch-all package
                subprocess.run(["apt-get", "download", "-qq", p], cwd=d, check=True)
            found = [f for f in os.listdir(d) if f.startswith(f"{p}_") and f.endswith((f"_{arch}.deb", "_all.deb"))]
        files.append(os.path.join(d, sorted(found)[-1]))
    return files


@functools.cache
def rootfs(pkgs, arch):
    """Every file of the packages' closure, docs left out, /etc kept, merged /usr."""
    import io
    import tarfile
    out = {}
    for deb in debs(pkgs, arch):
        data = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            for m in t.getmembers():
                p = m.name.lstrip("./")
                if not p or p.startswith(("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info")):
                    continue
                if re.match(r"(usr/)?lib/[^/]+-linux-gnu/tc/", p):  # tc's qdisc plugins (libatm)
                    continue
                p = re.sub(r"^(bin|sbin|lib|lib64)/", r"usr/\1/", p)
                if m.issym():
                    out[p] = (p, m.linkname, 0o777)
                elif m.isfile():
                    out[p] = (p, t.extractfile(m).read(), m.mode & 0o7777)
    files = list(out.values())
    files += [("bin", "usr/bin", 0o777), ("sbin", "usr/sbin", 0o777), ("lib", "usr/lib", 0o777)]
    if arch == "amd64":
        files.append(("lib64", "usr/lib64", 0o777))
        if "usr/lib64/ld-linux-x86-64.so.2" not in out:
            files.append(("usr/lib64/ld-linux-x86-64.so.2", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", 0o777))
    return files


@functools.cache
def applets():
    """The applets of Debian's busybox (the amd64 build lists them)."""
    binary = dict((p, d) for p, d, _ in images.busybox("amd64"))["usr/bin/busybox"]
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "busybox")  # busybox runs the applet its own name says
        images.write(tmp, binary)
        os.chmod(tmp, 0o755)
        return tuple(subprocess.run([tmp, "--list"], capture_output=True, text=True, check=True).stdout.split())


def busybox_applets(arch):
    """Debian's static busybox and a link per applet."""
    files = images.busybox(arch)[:1]
    return files + [(f"usr/bin/{a}", "busybox", 0o777) for a in applets() if a != "busybox"] + [("bin", "usr/bin", 0o777)]


def etc(users):
    """/etc/passwd, /etc/group, nsswitch.conf (getent and glibc's resolver read it)."""
    passwd = "root:x:0:0:root:/root:/bin/sh\n" + "".join(f"{n}:x:{u}:{g}::/:/bin/sh\n" for n, u, g in users)
    groups = {"root": 0}
    groups.update({n: g for n, _, g in users})
    group = "".join(f"{n}:x:{g}:\n" for n, g in groups.items())
    return [("etc/passwd", passwd.encode(), 0o644), ("etc/group", group.encode(), 0o644),
            ("etc/nsswitch.conf", b"hosts: files dns\npasswd: files\ngroup: files\n", 0o644),
            ("tmp/.keep", b"", 0o644)]


def bash_as_sh(files, arch):
    """files with Debian's bash (and its glibc) as /bin/sh. Debian's busybox
    ash (1.35, and trixie's 1.37 too) and dash drop environment variables
    whose names are not shell identifiers (`data-1`, from a ConfigMap's or
    Secret's envFrom) before running a command; upstream's busybox sh keeps
    them, and the conformance specs `sh -c env` and read them back."""
    debian = list(rootfs(("bash",), arch))
    taken = {f[0] for f in debian} | {"usr/bin/sh"}
    return [f for f in files if f[0] not in taken] + debian + [("usr/bin/sh", "bash", 0o777)]


def label(what):
    return {"io.kubexm.lab.stand-in": what}


def agnhost(arch, extra=()):
    src = read_module_file
    # The shell is dash, not busybox's: Debian's busybox-static runs its own
    # applet for a command it has (nc) before looking in PATH, where
    # upstream's Alpine sh finds netcat-openbsd. getent is glibc's (upstream:
    # musl-utils); bash as upstream installs it.
    debian = list(rootfs(("bind9-dnsutils", "curl", "netcat-openbsd", "iproute2", "socat", "dash", "bash", "libc-bin"),
                         arch))
    taken = {f[0] for f in debian}
    files = [f for f in busybox_applets(arch) if f[0] not in taken] + debian
    files = [f for f in files if f[0] not in ("usr/bin/nc", "usr/bin/sh")]
    files += [("usr/bin/nc", "nc.openbsd", 0o777), ("usr/bin/sh", "dash", 0o777)]
    files += [("agnhost", images.read(f"{BIN}/{arch}/agnhost"), 0o755), ("agnhost-2", "agnhost", 0o777),
              ("localhost.crt", src("test/images/agnhost/porter/localhost.crt"), 0o644),
              ("localhost.key", src("test/images/agnhost/porter/localhost.key"), 0o644),
              ("uploads/.keep", b"", 0o644)]
    files += etc([("user-defined-in-image", 1000, 50000)]) + list(extra)
    return files


def read_module_file(path):
    moddir = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    return images.read(os.path.join(moddir, "k8s.io/kubernetes@v1.37.2", path))


def main():
    lines = []
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    ag = {a: agnhost(a) for a in ARCHES}
    cfg = {"Entrypoint": ["/agnhost"], "Cmd": ["pause"], "Env": env,
           "ExposedPorts": {"80/tcp": {}, "8080/tcp": {}, "8081/tcp": {}, "9376/tcp": {}, "5000/tcp": {}},
           "Labels": label("agnhost 2.66.1 built from k8s.io/kubernetes v1.37.2 on Debian bookworm's tools and busybox, not Alpine")}
    lines.append(images.image(f"{E2E}/agnhost:2.66.1", ag, cfg))
    lines.append(images.image(f"{E2E}/agnhost:2.55", ag, dict(cfg, Labels=label("agnhost 2.66.1 under the tag 2.55"))))
    naut = {a: agnhost(a, [("nautilus.jpg", read_module_file("test/images/nautilus/html/nautilus.jpg"), 0o644),
                           ("data.json", read_module_file("test/images/nautilus/html/data.json"), 0o644)]) for a in ARCHES}
    lines.append(images.image(f"{E2E}/nautilus:1.8", naut, dict(cfg, Cmd=["test-webserver"])))
    # The ImageVolume spec mounts kitten as a volume and reads its data.json
    # and etc/os-release, which upstream's (Alpine) says "Alpine Linux": this
    # one says Debian, so that spec fails here where upstream's would pass
    # (and the lab's containerd 1.6 mounts no image volume anyway).
    kit = {a: agnhost(a, [("kitten.jpg", read_module_file("test/images/kitten/html/kitten.jpg"), 0o644),
                          ("data.json", read_module_file("test/images/kitten/html/data.json"), 0o644)]) for a in ARCHES}
    lines.append(images.image(f"{E2E}/kitten:1.8", kit, dict(cfg, Cmd=["test-webserver"], Labels=label(
        "agnhost 2.66.1 on Debian with kitten.jpg: etc/os-release is Debian's, not Alpine's"))))
    bb = {a: bash_as_sh(busybox_applets(a), a) + etc([]) for a in ARCHES}
    lines.append(images.image(f"{E2E}/busybox:1.37.0-2", bb, {"Cmd": ["sh"], "Env": env, "Labels": label(
        "Debian's busybox-static 1.35, not busybox 1.37; sh is Debian's bash (busybox's ash drops env names like data-1)")}))
    ng = {a: list(rootfs(("nginx-light",), a)) + etc([("www-data", 33, 33)])
          + [("var/log/nginx/.keep", b"", 0o644), ("var/lib/nginx/.keep", b"", 0o644), ("run/.keep", b"", 0o644)]
          for a in ARCHES}
    lines.append(images.image(f"{E2E}/nginx:1.27.0-2", ng,
                              {"Cmd": ["nginx", "-g", "daemon off;"], "Env": env, "ExposedPorts": {"80/tcp": {}},
                               "Labels": label("Debian's nginx-light 1.22, not nginx 1.27")}))
    dns = {a: list(rootfs(("bind9-dnsutils", "dash", "coreutils", "libc-bin", "grep", "sed"), a)) + etc([])
           + [("usr/bin/sh", "dash", 0o777)] for a in ARCHES}
    lines.append(images.image(f"{E2E}/glibc-dns-testing:2.1.1", dns, {"Cmd": ["sh"], "Env": env, "Labels": label(
        "Debian bookworm's dnsutils as upstream's, without its /coredns 1.5.0")}))
    nnp = {a: [("usr/local/bin/nnp", images.read(f"{BIN}/{a}/nnp"), 0o4755)] + busybox_applets(a) + etc([]) for a in ARCHES}
    lines.append(images.image(f"{E2E}/nonewprivs:1.4", nnp, {"Cmd": ["nnp"], "Env": env, "Labels": label(
        "nnp built from k8s.io/kubernetes v1.37.2 on Debian's busybox, not Alpine")}))
    sa = {a: [("sample-apiserver", images.read(f"{BIN}/{a}/sample-apiserver"), 0o755)] for a in ARCHES}
    lines.append(images.image(f"{E2E}/sample-apiserver:1.29.2", sa,
                              {"Entrypoint": ["/sample-apiserver"], "Labels": label("k8s.io/sample-apiserver v0.37.2, not 1.29.2")}))
    et = {}
    for a in ARCHES:
        tgz = f"{COMPONENTS}/github.com/etcd-io/etcd/releases/download/{ETCD}/etcd-{ETCD}-linux-{a}.tar.gz"
        et[a] = [(f"usr/local/bin/{b}", images.from_tgz(tgz, f"etcd-{ETCD}-linux-{a}/{b}"), 0o755) for b in ["etcd", "etcdctl"]]
    lines.append(images.image("registry.k8s.io/etcd:3.7.0-0", et,
                              {"Env": env, "Labels": label(f"etcd {ETCD} built from source, under kubeadm's 3.7.0-0 tag")}))
    images.write(os.path.join(OUT, "images.txt"), ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
