#!/usr/bin/env python3
"""Builds the lab's fixture upstream from real programs in Debian's packages.

Usage: fixture.py DEBS_DIR OUT_DIR

DEBS_DIR holds amd64/ and arm64/ with the .deb files `ci/lab prepare`
fetched with apt-get download. OUT_DIR receives:

  files/      an HTTP tree laid out like the real upstream URLs
              (dl.k8s.io/release/..., github.com/<org>/<repo>/releases/download/...,
              get.helm.sh/..., raw.githubusercontent.com/...) with the checksum
              files upstream publishes beside them, a chart repository and a
              plain chart URL;
  images/     one OCI image layout per image (busybox-static inside, an OCI
              index with amd64 and arm64 manifests), pushed to the fixture
              registry by `ci/lab prepare`;
  images.txt  reference and layout directory per image;
  catalog.yaml  the lab catalog: the fixture's versions with the sha256 of
              the fixture's own files, for `kubexm-bundle --catalog`.

Everything is deterministic: fixed mtimes, sorted members, gzip without
timestamps, so the digests are stable across runs.

Kubernetes, etcd 3.6, CoreDNS, flannel, helm and pause are built from
source by `ci/lab prepare` (k8s-build, components-build) and served beside
this tree, with the real MetalLB and NodeLocalDNS manifests from their Go
modules. crictl cannot be built here: the lab serves a stand-in
(stand-ins/crictl, which says so in --version) that nothing in the installer
calls. Calico and openebs are not served by the Go module proxy: their
manifests here are small stand-ins at the upstream paths, and the images the
bundle-side config names (calico, openebs, MetalLB, NodeLocalDNS, the demo
charts') are busybox images that are never run.
"""
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ARCHES = ["amd64", "arm64"]
OCI_ARCH = {"amd64": "amd64", "arm64": "arm64"}
# The Kubernetes version ci/lab builds (K8S_VERSION there).
K8S = "v1.37.2"
ETCD = "v3.4.23"
CONTAINERD = "1.6.20"
RUNC = "v1.1.5"
CNI = "v1.1.1"
CRICTL = "v1.29.0-lab"
REGISTRY = "2.8.2"
# Built from source by ci/lab prepare (components-build), served beside the fixture.
REAL_ETCD = "v3.6.16"
# The upgrade scenario's older minor (ci/lab's HOP_VERSION, HOP_ETCD; amd64 only).
HOP_K8S = "v1.36.3"
HOP_ETCD = "v3.6.8"
HELM = "v3.20.2"
MTIME = 1700000000
HERE = os.path.dirname(os.path.abspath(__file__))

# The images of the addons the lab does not build (never run: the lab applies
# their manifests with the API server's dry run), and the test workloads' image.
# Kubernetes', CoreDNS', pause's and flannel's images are built (images.py).
IMAGES = [
    "registry.k8s.io/dns/k8s-dns-node-cache:1.26.8",
    "docker.io/calico/node:v3.28.1",
    "docker.io/calico/cni:v3.28.1",
    "docker.io/calico/kube-controllers:v3.28.1",
    "quay.io/metallb/controller:v0.14.8",
    "quay.io/metallb/speaker:v0.14.8",
    "docker.io/openebs/provisioner-localpv:4.1.1",
    "docker.io/openebs/linux-utils:4.1.0",
    "docker.io/library/nginx:1.27-lab",
]
# This one is stored with Docker schema2 media types (a manifest list).
DOCKER_SCHEMA2 = "quay.io/metallb/speaker:v0.14.8"

# Addon manifests, at the real upstream paths, naming fixture images.
MANIFESTS = {
    "raw.githubusercontent.com/projectcalico/calico/v3.28.1/manifests/calico.yaml": [
        ("DaemonSet", "calico-node", "kube-system", ["docker.io/calico/cni:v3.28.1"], ["docker.io/calico/node:v3.28.1"]),
        ("Deployment", "calico-kube-controllers", "kube-system", [], ["docker.io/calico/kube-controllers:v3.28.1"]),
    ],
    "raw.githubusercontent.com/openebs/dynamic-localpv-provisioner/v4.1.1/deploy/kubectl/openebs-operator-lite.yaml": [
        ("Deployment", "openebs-localpv-provisioner", "openebs", [], ["docker.io/openebs/provisioner-localpv:4.1.1"]),
    ],
    "raw.githubusercontent.com/openebs/dynamic-localpv-provisioner/v4.1.1/deploy/kubectl/openebs-lite-sc.yaml": [],
}


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def targz(members):
    """members: list of (name, bytes, mode); deterministic tar.gz bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
        dirs = set()
        for name, _, _ in members:
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            if d in ("", "."):
                continue
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
            t.addfile(info)
        for name, data, mode in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, MTIME
            t.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as g:
        g.write(raw.getvalue())
    return out.getvalue()


def extract(deb, into):
    subprocess.run(["dpkg-deb", "-x", deb, into], check=True)


def read(root, path):
    with open(os.path.join(root, path.lstrip("/")), "rb") as f:
        return f.read()


def debs_of(debs_dir, arch):
    root = tempfile.mkdtemp(prefix=f"kxfix-{arch}-")
    d = os.path.join(debs_dir, arch)
    for f in sorted(os.listdir(d)):
        if f.endswith(".deb"):
            extract(os.path.join(d, f), root)
    return root


def standin(name):
    with open(os.path.join(HERE, "stand-ins", name), "rb") as f:
        return f.read()


def main():
    debs_dir, out = sys.argv[1], sys.argv[2]
    files = os.path.join(out, "files")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(files)
    digests = {}  # component -> version -> arch -> sha

    def publish(component, version, arch, relpath, data, mode=0o644):
        write(os.path.join(files, relpath), data, mode)
        digests.setdefault(component, {}).setdefault(version, {})[arch] = sha256(data)
        return sha256(data)

    etcd_sums, runc_sums = [], []
    busybox = {}
    for arch in ARCHES:
        root = debs_of(debs_dir, arch)
        busybox[arch] = read(root, "/bin/busybox")
        # etcd: etcd-vX-linux-ARCH/{etcd,etcdctl}; SHA256SUMS lists both arches.
        name = f"etcd-{ETCD}-linux-{arch}.tar.gz"
        top = f"etcd-{ETCD}-linux-{arch}"
        data = targz([(f"{top}/etcd", read(root, "/usr/bin/etcd"), 0o755), (f"{top}/etcdctl", read(root, "/usr/bin/etcdctl"), 0o755)])
        etcd_sums.append(f"{publish('etcd', ETCD, arch, f'github.com/etcd-io/etcd/releases/download/{ETCD}/{name}', data)}  {name}")
        # containerd: bin/*, and a .sha256sum beside it.
        name = f"containerd-{CONTAINERD}-linux-{arch}.tar.gz"
        members = [(f"bin/{b}", read(root, f"/usr/bin/{b}"), 0o755) for b in ["containerd", "containerd-shim", "containerd-shim-runc-v1", "containerd-shim-runc-v2", "ctr"]]
        rel = f"github.com/containerd/containerd/releases/download/v{CONTAINERD}/{name}"
        d = publish("containerd", CONTAINERD, arch, rel, targz(members))
        write(os.path.join(files, rel + ".sha256sum"), f"{d}  {name}\n".encode())
        # runc: a bare binary per arch; runc.sha256sum lists both.
        name = f"runc.{arch}"
        runc_sums.append(f"{publish('runc', RUNC, arch, f'github.com/opencontainers/runc/releases/download/{RUNC}/{name}', read(root, '/usr/sbin/runc'), 0o755)}  {name}")
        # CNI plugins: ./<plugin> in a tgz, .sha256 beside it.
        name = f"cni-plugins-linux-{arch}-{CNI}.tgz"
        cni_dir = os.path.join(root, "usr/lib/cni")
        members = [(f"./{p}", read(cni_dir, p), 0o755) for p in sorted(os.listdir(cni_dir))]
        rel = f"github.com/containernetworking/plugins/releases/download/{CNI}/{name}"
        d = publish("cni-plugins", CNI, arch, rel, targz(members))
        write(os.path.join(files, rel + ".sha256"), f"{d}  {name}\n".encode())
        # The CNCF registry, as distribution publishes it.
        name = f"registry_{REGISTRY}_linux_{arch}.tar.gz"
        rel = f"github.com/distribution/distribution/releases/download/v{REGISTRY}/{name}"
        d = publish("registry", "v" + REGISTRY, arch, rel, targz([("registry", read(root, "/usr/bin/docker-registry"), 0o755)]))
        write(os.path.join(files, rel + ".sha256"), f"{d}  {name}\n".encode())
        name = f"crictl-{CRICTL}-linux-{arch}.tar.gz"
        rel = f"github.com/kubernetes-sigs/cri-tools/releases/download/{CRICTL}/{name}"
        d = publish("crictl", CRICTL, arch, rel, targz([("crictl", standin("crictl"), 0o755)]))
        write(os.path.join(files, rel + ".sha256"), f"{d}  {name}\n".encode())
        shutil.rmtree(root)
    write(os.path.join(files, f"github.com/etcd-io/etcd/releases/download/{ETCD}/SHA256SUMS"), ("\n".join(etcd_sums) + "\n").encode())
    write(os.path.join(files, f"github.com/opencontainers/runc/releases/download/{RUNC}/runc.sha256sum"), ("\n".join(runc_sums) + "\n").encode())

    for rel, workloads in MANIFESTS.items():
        write(os.path.join(files, rel), manifest(workloads, rel).encode())
    charts(files)
    images(os.path.join(out, "images"), busybox, out)
    catalog(out, digests)


# The text upstream's manifests hold where kubexm fills in cluster.yaml's
# settings (manifests/addon-patches.yaml), shaped and indented as upstream
# has it, so a patch that would miss the real manifest misses these too.
UPSTREAM_TEXT = {
    "calico.yaml": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: calico-node-settings\n  namespace: kube-system\nspec:\n  selector:\n    matchLabels: {k8s-app: calico-node-settings}\n  template:\n    metadata:\n      labels: {k8s-app: calico-node-settings}\n    spec:\n      containers:\n        - name: calico-node\n          image: docker.io/calico/node:v3.28.1\n          env:\n            - name: CALICO_NETWORKING_BACKEND\n              value: \"bird\"\n            # The default IPv4 pool to create on startup if none exists. Pod IPs will be\n            # chosen from this range. Changing this value after installation will have\n            # no effect. This should fall within `--cluster-cidr`.\n            # - name: CALICO_IPV4POOL_CIDR\n            #   value: \"192.168.0.0/16\"\n",
    "openebs-lite-sc.yaml": "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: openebs-hostpath\n  annotations:\n    openebs.io/cas-type: local\n    cas.openebs.io/config: |\n      - name: StorageType\n        value: \"hostpath\"\n      - name: BasePath\n        value: \"/var/openebs/local/\"\nprovisioner: openebs.io/local\nreclaimPolicy: Delete\nvolumeBindingMode: WaitForFirstConsumer\n",
}


def manifest(workloads, rel=""):
    docs = ["# kubexm lab fixture: a small stand-in for the upstream manifest at this path.\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kubexm-lab-fixture\n  namespace: kube-system\ndata:\n  note: lab fixture\n"]
    extra = UPSTREAM_TEXT.get(rel.rsplit("/", 1)[-1])
    if extra:
        docs.append(extra)
    # As upstream manifests do, the namespaces they use (kube-system aside) are in them.
    for ns in sorted({w[2] for w in workloads} - {"kube-system"}):
        docs.append(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n")
    for kind, name, ns, init, containers in workloads:
        lines = [f"apiVersion: apps/v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n"
                 f"  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n"]
        if init:
            lines.append("      initContainers:\n")
            for i, img in enumerate(init):
                lines.append(f"        - name: init-{i}\n          image: {img}\n          command: [\"/bin/sh\", \"-c\", \"true\"]\n")
        lines.append("      containers:\n")
        for i, img in enumerate(containers):
            lines.append(f"        - name: c{i}\n          image: \"{img}\"\n          imagePullPolicy: IfNotPresent\n")
        docs.append("".join(lines))
    return "---\n".join(docs)


def chart_tgz(name, version, image):
    chart = f"apiVersion: v2\nname: {name}\nversion: {version}\ndescription: kubexm lab fixture chart\n"
    values = f"image:\n  repository: {image.rsplit(':', 1)[0]}\n  tag: \"{image.rsplit(':', 1)[1]}\"\n"
    tmpl = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  template:\n    spec:\n      containers:\n        - name: app\n          image: \"{{ .Values.image.repository }}:{{ .Values.image.tag }}\"\n"
    return targz([(f"{name}/Chart.yaml", chart.encode(), 0o644), (f"{name}/values.yaml", values.encode(), 0o644), (f"{name}/templates/deployment.yaml", tmpl.encode(), 0o644)])


def charts(files):
    # A chart repository (index.yaml + tgz) and one chart at a plain URL.
    repo = os.path.join(files, "charts.lab.invalid/stable")
    data = chart_tgz("demo", "0.1.0", "docker.io/library/nginx:1.27-lab")
    write(os.path.join(repo, "demo-0.1.0.tgz"), data)
    index = ("apiVersion: v1\nentries:\n  demo:\n    - apiVersion: v2\n      name: demo\n      version: 0.1.0\n"
             f"      digest: {sha256(data)}\n      urls: [demo-0.1.0.tgz]\n      created: \"2023-11-14T22:13:20Z\"\ngenerated: \"2023-11-14T22:13:20Z\"\n")
    write(os.path.join(repo, "index.yaml"), index.encode())
    write(os.path.join(files, "charts.lab.invalid/plain/plain-0.2.0.tgz"), chart_tgz("plain", "0.2.0", "docker.io/library/nginx:1.27-lab"))


def blob(layout, data):
    d = sha256(data)
    write(os.path.join(layout, "blobs/sha256", d), data)
    return {"digest": "sha256:" + d, "size": len(data)}


def images(root, busybox, out):
    lines = []
    for ref in IMAGES:
        layout = os.path.join(root, ref.replace("/", "_").replace(":", "_"))
        docker = ref == DOCKER_SCHEMA2
        mt = {
            "index": "application/vnd.docker.distribution.manifest.list.v2+json" if docker else "application/vnd.oci.image.index.v1+json",
            "manifest": "application/vnd.docker.distribution.manifest.v2+json" if docker else "application/vnd.oci.image.manifest.v1+json",
            "config": "application/vnd.docker.container.image.v1+json" if docker else "application/vnd.oci.image.config.v1+json",
            "layer": "application/vnd.docker.image.rootfs.diff.tar.gzip" if docker else "application/vnd.oci.image.layer.v1.tar+gzip",
        }
        manifests = []
        for arch in ARCHES:
            # One layer: busybox at /bin/busybox, /bin/sh linking to it, and the
            # image's own name, so a pull of the wrong image is visible.
            raw = io.BytesIO()
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
                for d in ["bin", "etc"]:
                    i = tarfile.TarInfo(d); i.type, i.mode, i.mtime = tarfile.DIRTYPE, 0o755, MTIME; t.addfile(i)
                i = tarfile.TarInfo("bin/busybox"); i.size, i.mode, i.mtime = len(busybox[arch]), 0o755, MTIME
                t.addfile(i, io.BytesIO(busybox[arch]))
                i = tarfile.TarInfo("bin/sh"); i.type, i.linkname, i.mode, i.mtime = tarfile.SYMTYPE, "busybox", 0o777, MTIME; t.addfile(i)
                name = f"{ref} {arch}\n".encode()
                i = tarfile.TarInfo("etc/kubexm-lab-image"); i.size, i.mode, i.mtime = len(name), 0o644, MTIME
                t.addfile(i, io.BytesIO(name))
            diff = raw.getvalue()
            gz = io.BytesIO()
            with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
                g.write(diff)
            layer = dict(mediaType=mt["layer"], **blob(layout, gz.getvalue()))
            config = {"architecture": OCI_ARCH[arch], "os": "linux", "created": "2023-11-14T22:13:20Z",
                      "config": {"Entrypoint": ["/bin/busybox"], "Cmd": ["sh", "-c", "cat /etc/kubexm-lab-image"], "Env": ["PATH=/bin"]},
                      "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha256(diff)]}, "history": [{"created": "2023-11-14T22:13:20Z", "created_by": "kubexm lab fixture"}]}
            cfg = dict(mediaType=mt["config"], **blob(layout, json.dumps(config, sort_keys=True).encode()))
            man = {"schemaVersion": 2, "mediaType": mt["manifest"], "config": cfg, "layers": [layer]}
            m = blob(layout, json.dumps(man, sort_keys=True).encode())
            manifests.append(dict(mediaType=mt["manifest"], platform={"architecture": OCI_ARCH[arch], "os": "linux"}, **m))
        index = {"schemaVersion": 2, "mediaType": mt["index"], "manifests": manifests}
        top = blob(layout, json.dumps(index, sort_keys=True).encode())
        write(os.path.join(layout, "oci-layout"), b'{"imageLayoutVersion":"1.0.0"}')
        layout_index = {"schemaVersion": 2, "manifests": [dict(mediaType=mt["index"], annotations={"org.opencontainers.image.ref.name": "fixture"}, **top)]}
        write(os.path.join(layout, "index.json"), json.dumps(layout_index).encode())
        lines.append(f"{ref} {layout} {top['digest']}")
    write(os.path.join(out, "images.txt"), ("\n".join(lines) + "\n").encode())


def catalog(out, digests):
    """The lab catalog: fixture versions and the digests of the fixture's files."""
    lines = ["# Generated by ci/lab/fixture.py: the fixture upstream's versions and digests.",
             f"default: {K8S}", "components:"]
    for comp in ["kubeadm", "kubelet", "kubectl", "etcd", "containerd", "runc", "crictl", "cni-plugins", "helm"]:
        lines += [f"  {comp}:", "    versions:"]
        for version, per_arch in digests.get(comp, {}).items():
            inner = ", ".join(f'{a}: "{d}"' for a, d in sorted(per_arch.items()))
            lines.append(f'      "{version}": {{{inner}}}')
        built = {"kubeadm": [K8S, HOP_K8S], "kubelet": [K8S, HOP_K8S], "kubectl": [K8S, HOP_K8S],
                 "etcd": [REAL_ETCD, HOP_ETCD], "helm": [HELM]}.get(comp, [])
        for version in built:
            lines.append(f'      "{version}": {{}}')
    # The real cluster: Kubernetes v1.37.2, etcd v3.6.16 and helm v3.20.2
    # built from source by `ci/lab prepare` (flannel v0.28.10 too: the
    # built-in catalog lists it).
    # Not pinned here: the builder takes the fixture's published checksum
    # files, as it does upstream's for a version the catalog does not pin.
    real = f'etcd: {REAL_ETCD}, containerd: "{CONTAINERD}", runc: {RUNC}, crictl: {CRICTL}, cni-plugins: {CNI}, helm: {HELM}'
    lines += ["minors:", "  v1.37:", f"    components: {{{real}}}", "    notes:",
              "      - \"lab: Kubernetes, etcd and helm built from source; Debian's containerd, runc and CNI plugins; crictl is a lab stand-in nothing calls\"",
              # v1.36 (the upgrade's older minor): its etcd and CoreDNS built too.
              "  v1.36:", f"    components: {{{real.replace(REAL_ETCD, HOP_ETCD)}}}", "    notes:",
              "      - \"lab: Kubernetes v1.36.3, etcd v3.6.8 and CoreDNS v1.14.2 built from source, amd64 only\""]
    write(os.path.join(out, "catalog.yaml"), ("\n".join(lines) + "\n").encode())
    with open(os.path.join(out, "digests.json"), "w") as f:
        json.dump(digests, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
