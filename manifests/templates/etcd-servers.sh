# kubexm: this control-plane node's API server reads etcd at {{SERVERS}}
# (after a change of etcd's members). Written by kubexm-install; the last
# line, {{TAIL}}, is `current` (the check: the manifest and the running
# process say so) or `update` (the manifest's --etcd-servers rewritten, the
# old pod replaced by a new one, ready). Safe to re-run.
m={{MANIFEST}}
want={{SERVERS}}
{{STATIC_POD}}
# The new manifest is written beside it and moved into place by swap_manifest.
t=$(beside "$m")
now() { sed -n 's/^ *- --etcd-servers=//p' "$m"; }
# The running API server's arguments, one per line: the whole argument must match.
running() { ps -eo args | grep -- '^kube-apiserver ' | tr ' ' '\n' | grep -qxF -- "--etcd-servers=$want"; }
current() { [ "$(now)" = "$want" ] && running; }
ready() { running && {{KUBECTL}} --server {{SERVER}} get --raw=/readyz --request-timeout=5s >/dev/null 2>&1; }
update() {
  unfinished "$m"
  [ -f "$m" ] || { echo "$m is missing: not a control-plane node kubeadm set up; is the node's kubeadm join done? run apply again" >&2; return 1; }
  grep -q -- '^ *- --etcd-servers=' "$m" || { echo "$m has no --etcd-servers line: kubexm cannot tell its API server where etcd is; add the line ($want) by hand and run the command again" >&2; return 1; }
  if [ "$(now)" != "$want" ]; then
    sed "s|^\( *- --etcd-servers=\).*|\1$want|" "$m" > "$t" && chmod --reference="$m" "$t" && swap_manifest "$m" "$t" kube-apiserver || return 1
  else
    # The manifest says so already (an earlier run): a process started
    # before it is stopped, the kubelet starts the new pod.
    old=$(pgrep -of '^kube-apiserver( |$)') || old=
    if [ -n "$old" ] && ! running; then stop_process "$old"; fi
  fi
  t0=$(date +%s)
  within 180 "the API server at {{SERVER}} is not ready with --etcd-servers=$want 180 s after the change; look at: journalctl -u kubelet and crictl ps -a on this node, then run the command again" ready || return 1
  echo "API server at {{SERVER}} reads etcd at $want ($(( $(date +%s) - t0 )) s)"
}
{{TAIL}}
