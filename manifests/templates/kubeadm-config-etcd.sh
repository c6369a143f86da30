# kubexm: kubeadm's ClusterConfiguration (ConfigMap kube-system/kubeadm-config,
# what a joining control-plane node reads) lists etcd's members as the
# cluster has them: {{ENDPOINTS}}. Written by kubexm-install; the last line,
# {{TAIL}}, is `current` (the check) or `update`. Safe to re-run.
k="{{KUBECTL}} -n kube-system"
cc() { $k get configmap kubeadm-config -o jsonpath='{.data.ClusterConfiguration}'; }
# The endpoints under etcd.external, one per line.
listed() { printf '%s\n' "$1" | awk '/^  external:/ { e = 1; next } e && /^    endpoints:/ { l = 1; next } l && /^    - / { print $2; next } { l = 0 } /^[^ ]/ { e = 0 }'; }
want() { for e in {{ENDPOINTS}}; do echo "$e"; done; }
current() { c=$(cc) || return 1; [ "$(listed "$c")" = "$(want)" ]; }
update() {
  c=$(cc) || { echo "cannot read ConfigMap kube-system/kubeadm-config through this node's admin kubeconfig: is the API server up? run the command again" >&2; return 1; }
  [ -n "$(listed "$c")" ] || { echo "kubeadm-config's ClusterConfiguration has no etcd.external.endpoints: edit it (kubectl -n kube-system edit configmap kubeadm-config) to list {{ENDPOINTS}}" >&2; return 1; }
  f=$(mktemp) && trap 'rm -f "$f"' EXIT
  printf '%s\n' "$c" | awk -v eps="{{ENDPOINTS}}" '
    /^  external:/ { e = 1; print; next }
    e && /^    endpoints:/ { print; n = split(eps, a, " "); for (i = 1; i <= n; i++) print "    - " a[i]; skip = 1; next }
    skip && /^    - / { next }
    { skip = 0 }
    /^[^ ]/ { e = 0 }
    { print }' > "$f"
  $k create configmap kubeadm-config --from-file=ClusterConfiguration="$f" --dry-run=client -o yaml | $k replace -f - >/dev/null || return 1
  current || { echo "kubeadm-config does not list {{ENDPOINTS}} after the update" >&2; return 1; }
  echo "kubeadm-config lists etcd at {{ENDPOINTS}}"
}
{{TAIL}}
