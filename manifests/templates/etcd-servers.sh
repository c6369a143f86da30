# kubexm: this control-plane node's API server reads etcd at {{SERVERS}}
# (after a change of etcd's members). Written by kubexm-install; the last
# line, {{TAIL}}, is `current` (the check: the manifest and the running
# process say so) or `update` (the manifest's --etcd-servers rewritten, the
# old process stopped after 5 s, the new one ready). Safe to re-run.
m={{MANIFEST}}
want={{SERVERS}}
now() { sed -n 's/^ *- --etcd-servers=//p' "$m"; }
# The running API server's arguments, one per line: the whole argument must match.
running() { ps -eo args | grep -- '^kube-apiserver ' | tr ' ' '\n' | grep -qxF -- "--etcd-servers=$want"; }
current() { [ "$(now)" = "$want" ] && running; }
update() {
  [ -f "$m" ] || { echo "$m is missing: not a control-plane node kubeadm set up; is the node's kubeadm join done? run apply again" >&2; return 1; }
  grep -q -- '^ *- --etcd-servers=' "$m" || { echo "$m has no --etcd-servers line: kubexm cannot tell its API server where etcd is; add the line ($want) by hand and run the command again" >&2; return 1; }
  if [ "$(now)" != "$want" ]; then
    # Written beside it as a dotfile (the kubelet reads no hidden file as a
    # static pod), then moved into place.
    t="$(dirname "$m")/.$(basename "$m").kubexm"
    sed "s|^\( *- --etcd-servers=\).*|\1$want|" "$m" > "$t" && chmod --reference="$m" "$t" && mv -f "$t" "$m"
  fi
  # The kubelet starts the new pod; the old process gets 5 s for what it
  # serves (clients go to the other API servers meanwhile).
  old=$(pgrep -of '^kube-apiserver( |$)') || old=
  if [ -n "$old" ] && ! running; then
    kill "$old" 2>/dev/null || true
    for _ in 1 2 3 4 5; do kill -0 "$old" 2>/dev/null || break; sleep 1; done
    kill -9 "$old" 2>/dev/null || true
  fi
  t0=$(date +%s)
  until running && {{KUBECTL}} --server {{SERVER}} get --raw=/readyz --request-timeout=5s >/dev/null 2>&1; do
    if [ $(( $(date +%s) - t0 )) -ge 180 ]; then
      echo "the API server at {{SERVER}} is not ready with --etcd-servers=$want 180 s after the change; look at: journalctl -u kubelet and crictl ps -a on this node, then run the command again" >&2
      return 1
    fi
    sleep 1
  done
  echo "API server at {{SERVER}} reads etcd at $want ($(( $(date +%s) - t0 )) s)"
}
{{TAIL}}
