#!/usr/bin/env python3
"""Container images of the lab's real components, shaped like the official ones.

Usage: images.py K8S_FILES COMPONENTS_FILES OUT DEBIAN_POOL BASE_IMAGES DEBS

Reads the binaries `ci/lab prepare` built (laid out as their upstreams
publish them) and writes one OCI image layout per image under OUT, plus
OUT/images.txt for push.py (`REFERENCE LAYOUT INDEX_DIGEST`):

  registry.k8s.io/pause:3.10.2                 amd64, arm64  /pause (static), user 65535
  registry.k8s.io/kube-apiserver:v1.37.2       amd64         /usr/local/bin/kube-apiserver
  registry.k8s.io/kube-controller-manager:...  amd64         /usr/local/bin/kube-controller-manager
  registry.k8s.io/kube-scheduler:v1.37.2       amd64         /usr/local/bin/kube-scheduler
  registry.k8s.io/coredns/coredns:v1.14.6      amd64, arm64  /coredns
  registry.k8s.io/kube-proxy:v1.37.2           amd64, arm64  /usr/local/bin/kube-proxy with iptables (nft)
                                                             and conntrack from Debian (the fixture archive's
                                                             debs, glibc from the lab's base image)
  docker.io/flannel/flannel:v0.28.10           amd64, arm64  /opt/bin/flanneld with iptables (nft) and busybox
  docker.io/flannel/flannel-cni-plugin:v0.9.1-kubexm-lab
                                               amd64, arm64  /flannel (the CNI plugin) and busybox

With KUBEXM_LAB_IMAGES=kubernetes, KUBEXM_LAB_K8S=VERSION and
KUBEXM_LAB_COREDNS=VERSION it writes only Kubernetes' own images of VERSION
(the control plane's and kube-proxy) and CoreDNS's, for amd64: the upgrade
scenario's older minor.

Like the official images the control-plane ones hold the static binary alone
(kubeadm's static pods name the command), with PATH covering
/usr/local/bin. Layers and configs are reproducible (fixed mtimes, sorted).
"""
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

# Set from the arguments by main() (test-images.py imports this module).
K8S = COMPONENTS = OUT = POOL = BASE = DEBS = ""
TRIPLET = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
PROXY_DEBS = ["iptables", "libip4tc2", "libip6tc2", "libxtables12", "libnftnl11", "libmnl0",
              "libnetfilter-conntrack3", "libnfnetlink0", "conntrack"]
KV = os.environ.get("KUBEXM_LAB_K8S", "v1.37.2")
COREDNS = os.environ.get("KUBEXM_LAB_COREDNS", "v1.14.6")
FLANNEL = "v0.28.10"
FLANNEL_CNI = "v0.9.1"
# The CNI plugin is built from containernetworking/plugins (its home before
# flannel-io/cni-plugin, which the proxy does not serve): the tag says so.
FLANNEL_CNI_IMAGE = f"docker.io/flannel/flannel-cni-plugin:{FLANNEL_CNI}-kubexm-lab"
MTIME = 1700000000
CREATED = "2023-11-14T22:13:20Z"
PATH_ENV = "PATH=/usr/local/bin:/usr/bin:/bin"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def blob(layout, data):
    d = sha256(data)
    write(os.path.join(layout, "blobs/sha256", d), data)
    return {"digest": "sha256:" + d, "size": len(data)}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def from_tgz(path, member):
    with tarfile.open(path) as t:
        return t.extractfile(member).read()


def layer(files):
    """A gzip layer of (path, bytes, mode), parent directories included; a
    `str` in place of the bytes is a symlink's target."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
        links = {p for p, d, _ in files if isinstance(d, str)}
        dirs = sorted({"/".join(p.split("/")[:i]) for p, _, _ in files for i in range(1, p.count("/") + 1)} - links)
        for d in dirs:
            i = tarfile.TarInfo(d)
            i.type, i.mode, i.mtime = tarfile.DIRTYPE, 0o755, MTIME
            t.addfile(i)
        for p, data, mode in sorted(files, key=lambda f: f[0]):
            i = tarfile.TarInfo(p)
            i.mode, i.mtime = mode, MTIME
            if isinstance(data, str):
                i.type, i.linkname = tarfile.SYMTYPE, data
                t.addfile(i)
            else:
                i.size = len(data)
                t.addfile(i, io.BytesIO(data))
    diff = raw.getvalue()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
        g.write(diff)
    return diff, gz.getvalue()


def image(ref, per_arch, config):
    """per_arch: arch -> [(path, bytes, mode)]; config: the image config's `config`."""
    layout = os.path.join(OUT, ref.replace("/", "_").replace(":", "_"))
    manifests = []
    for arch, files in sorted(per_arch.items()):
        check_libraries(ref, arch, files)
        diff, gz = layer(files)
        lay = dict(mediaType="application/vnd.oci.image.layer.v1.tar+gzip", **blob(layout, gz))
        cfg = {"architecture": arch, "os": "linux", "created": CREATED, "config": config,
               "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha256(diff)]},
               "history": [{"created": CREATED, "created_by": "kubexm lab: built from source by ci/lab prepare"}]}
        c = dict(mediaType="application/vnd.oci.image.config.v1+json", **blob(layout, json.dumps(cfg, sort_keys=True).encode()))
        man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": c, "layers": [lay]}
        m = blob(layout, json.dumps(man, sort_keys=True).encode())
        manifests.append(dict(mediaType="application/vnd.oci.image.manifest.v1+json", platform={"architecture": arch, "os": "linux"}, **m))
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
    top = blob(layout, json.dumps(index, sort_keys=True).encode())
    write(os.path.join(layout, "oci-layout"), b'{"imageLayoutVersion":"1.0.0"}')
    entry = dict(mediaType="application/vnd.oci.image.index.v1+json", annotations={"org.opencontainers.image.ref.name": ref}, **top)
    write(os.path.join(layout, "index.json"), json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode())
    return f"{ref} {layout} {top['digest']}"


def deb_files(name, arch):
    """Regular files and symlinks of a Debian package from the fixture archive (docs left out)."""
    found = []
    for root, _, names in os.walk(POOL):
        found += [os.path.join(root, n) for n in names if n.startswith(f"{name}_") and n.endswith(f"_{arch}.deb")]
    if len(found) != 1:
        raise SystemExit(f"images.py: expected one {name} deb for {arch} in {POOL}, found {found}")
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", found[0]], check=True, capture_output=True).stdout
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for m in t.getmembers():
            p = m.name.lstrip("./")
            if not p or p.startswith("usr/share/") or p.startswith("etc/"):
                continue
            if m.issym():
                out.append((p, m.linkname, 0o777))
            elif m.isfile():
                out.append((p, t.extractfile(m).read(), m.mode & 0o777))
    return out


def busybox(arch):
    """Debian's static busybox with the applets an image's scripts call (sh, cp)."""
    found = [f for f in os.listdir(f"{DEBS}/{arch}") if f.startswith("busybox-static_")]
    if len(found) != 1:
        raise SystemExit(f"images.py: expected one busybox-static deb in {DEBS}/{arch}, found {found}")
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", f"{DEBS}/{arch}/{found[0]}"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        binary = t.extractfile("./bin/busybox").read()
    return [("usr/bin/busybox", binary, 0o755), ("usr/bin/sh", "busybox", 0o777), ("usr/bin/cp", "busybox", 0o777)]


def with_iptables(files, arch, debs):
    """files plus Debian's iptables (nft backend, as the alternatives would
    pick) from `debs`, glibc from the base image and a merged /usr."""
    for d in debs:
        files += deb_files(d, arch)
    t = TRIPLET[arch]
    base = f"{BASE}/{arch}"
    loader = {"amd64": "ld-linux-x86-64.so.2", "arm64": "ld-linux-aarch64.so.1"}[arch]
    # glibc: libc, libm (xtables' statistic match, which kube-proxy uses
    # once a Service has two endpoints) and the loader.
    for lib in ["libc.so.6", "libm.so.6", loader]:
        files.append((f"usr/lib/{t}/{lib}", read(os.path.realpath(f"{base}/usr/lib/{t}/{lib}")), 0o755))
    # Merged /usr, and the ELF interpreter where binaries look for it.
    files += [("lib", "usr/lib", 0o777), ("sbin", "usr/sbin", 0o777), ("bin", "usr/bin", 0o777)]
    if arch == "amd64":
        files += [("lib64", "usr/lib64", 0o777), (f"usr/lib64/{loader}", f"../lib/{t}/{loader}", 0o777)]
    else:
        files.append((f"usr/lib/{loader}", f"{t}/{loader}", 0o777))
    for cmd in ["iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"]:
        nft = cmd.replace("tables", "tables-nft", 1)
        files.append((f"usr/sbin/{cmd}", nft, 0o777))
    return files


def check_libraries(ref, arch, files):
    """Fails unless every shared library an ELF file of the image needs is in
    it (under usr/lib/<triplet>), so a missing one shows here and not as a
    plugin that fails to load at run time."""
    import tempfile
    have = {os.path.basename(p) for p, _, _ in files}
    missing = set()
    with tempfile.TemporaryDirectory() as tmp:
        for p, data, _ in files:
            if isinstance(data, str) or not data.startswith(b"\x7fELF"):
                continue
            f = os.path.join(tmp, "elf")
            write(f, data)
            out = subprocess.run(["readelf", "-d", f], check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                if "(NEEDED)" in line:
                    lib = line.split("[", 1)[1].rstrip("]")
                    if lib not in have:
                        missing.add(f"{lib} (needed by /{p})")
    if missing:
        raise SystemExit(f"images.py: {ref} for {arch} lacks " + ", ".join(sorted(missing)))


def kube_proxy(arch):
    """kube-proxy with Debian's iptables and conntrack."""
    files = [("usr/local/bin/kube-proxy", read(f"{K8S}/dl.k8s.io/release/{KV}/bin/linux/{arch}/kube-proxy"), 0o755)]
    return with_iptables(files, arch, PROXY_DEBS)


def flannel(arch):
    """flanneld at /opt/bin as upstream's image has it, with Debian's iptables
    and busybox (the manifest's install-cni init container runs `cp`)."""
    files = [("opt/bin/flanneld", read(f"{COMPONENTS}/github.com/flannel-io/flannel/releases/download/{FLANNEL}/flanneld-{arch}"), 0o755)]
    files += busybox(arch)
    return with_iptables(files, arch, [d for d in PROXY_DEBS if d != "conntrack"])


def kubernetes_images(arches):
    """The control plane's images (amd64) and kube-proxy's (for `arches`) of KV."""
    lines = []
    for b in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"]:
        binary = read(f"{K8S}/dl.k8s.io/release/{KV}/bin/linux/amd64/{b}")
        files = {"amd64": [(f"usr/local/bin/{b}", binary, 0o755)]}
        lines.append(image(f"registry.k8s.io/{b}:{KV}", files, {"Entrypoint": [f"/usr/local/bin/{b}"], "Env": [PATH_ENV]}))
    proxy = {a: kube_proxy(a) for a in arches}
    lines.append(image(f"registry.k8s.io/kube-proxy:{KV}", proxy,
                       {"Entrypoint": ["/usr/local/bin/kube-proxy"], "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}))
    return lines


def coredns_image(arches):
    """CoreDNS's image of COREDNS for `arches`."""
    v = COREDNS.lstrip("v")
    files = {a: [("coredns", from_tgz(f"{COMPONENTS}/github.com/coredns/coredns/releases/download/v{v}/coredns_{v}_linux_{a}.tgz", "coredns"), 0o755)]
             for a in arches}
    return image(f"registry.k8s.io/coredns/coredns:{COREDNS}", files,
                 {"Entrypoint": ["/coredns"], "ExposedPorts": {"53/tcp": {}, "53/udp": {}}, "User": "0"})


def main():
    global K8S, COMPONENTS, OUT, POOL, BASE, DEBS
    K8S, COMPONENTS, OUT, POOL, BASE, DEBS = sys.argv[1:7]
    lines = []
    if os.environ.get("KUBEXM_LAB_IMAGES") == "kubernetes":
        lines += kubernetes_images(["amd64"]) + [coredns_image(["amd64"])]
        write(os.path.join(OUT, "images.txt"), ("\n".join(lines) + "\n").encode())
        return
    pause = {a: [("pause", read(f"{COMPONENTS}/kubexm-lab/pause/v3.10.2/{a}/pause"), 0o755)] for a in ["amd64", "arm64"]}
    lines.append(image("registry.k8s.io/pause:3.10.2", pause, {"Entrypoint": ["/pause"], "User": "65535:65535"}))
    lines.append(coredns_image(["amd64", "arm64"]))
    lines += kubernetes_images(["amd64", "arm64"])
    fl = {a: flannel(a) for a in ["amd64", "arm64"]}
    lines.append(image(f"docker.io/flannel/flannel:{FLANNEL}", fl,
                       {"Entrypoint": ["/opt/bin/flanneld"], "Env": ["PATH=/opt/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}))
    cni = {a: [("flannel", read(f"{COMPONENTS}/kubexm-lab/flannel-cni/{FLANNEL_CNI}/{a}/flannel"), 0o755)] + busybox(a)
           + [("bin", "usr/bin", 0o777)] for a in ["amd64", "arm64"]}
    lines.append(image(FLANNEL_CNI_IMAGE, cni, {"Env": ["PATH=/usr/bin:/bin"]}))
    write(os.path.join(OUT, "images.txt"), ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
