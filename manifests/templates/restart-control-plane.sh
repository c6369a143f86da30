# kubexm: on a control-plane node (`certs renew`), which static pods' main
# process started before one of the files it reads was last written, and
# replacing each by a new pod (see swap_manifest).
# Written by kubexm-install; the last line, {{TAIL}}, is the check (none
# stale) or the restart (each stale pod replaced by a new one and waited for:
# the API server first, then the others side by side; then this node's API
# server answers again). procps only: pgrep, ps.
{{STATIC_POD}}
pid_of() { pgrep -of "^$1( |\$)"; }
# Pod $1 runs again: a process other than $2 that started after $3.
runs_again() {
  new=$(pid_of "$1") || return 1
  [ "$new" != "$2" ] && [ $(( $(started "$1") + 1 )) -ge "$3" ]
}
api_ready() { {{KUBECTL}} --server {{SERVER}} get --raw=/readyz --request-timeout=5s >/dev/null 2>&1; }
# When the pod's process started, in seconds since the epoch (0: not running).
started() {
  p=$(pid_of "$1") || { echo 0; return; }
  e=$(ps -o etimes= -p "$p" | tr -d ' ')
  echo $(( $(date +%s) - ${e:-0} ))
}
# The newest change of the pod's files (seconds since the epoch).
newest() {
  n=0
  for f in $(echo "$1" | tr ',' ' '); do
    [ -f "$f" ] || continue
    mt=$(stat -c %Y "$f"); [ "$mt" -gt "$n" ] && n=$mt
  done
  echo "$n"
}
# The running pods whose process started before one of their files changed
# (a second of slack: ps counts whole seconds); a pod not running is left
# to the kubelet.
stale() {
  for pair in {{PODS}}; do
    c=${pair%%=*}
    # A run stopped between swap_manifest's two moves: its new manifest waits beside.
    if [ ! -f "{{MANIFESTS}}/$c.yaml" ] && [ -f "$(beside "{{MANIFESTS}}/$c.yaml")" ]; then echo "$c"; continue; fi
    pid_of "$c" >/dev/null || continue
    if [ "$(newest "${pair#*=}")" -gt $(( $(started "$c") + 1 )) ]; then echo "$c"; fi
  done
}
# replace PAIR: the pod of PAIR (name=files) replaced by a new one when
# stale, and waited for until it runs again.
replace() {
  pair=$1
  c=${pair%%=*}
  m={{MANIFESTS}}/$c.yaml
  t=$(beside "$m")
  stale | grep -qx "$c" || return 0
  old=$(pid_of "$c") || old=
  want=$(newest "${pair#*=}")
  # A new pod, not a restarted container: a label of the manifest changes
  # (the kubelet would wait out a crash back-off of up to 5 minutes for a
  # container that exited before, as a controller-manager does when its
  # API server restarts). Without labels, only the process is stopped.
  if [ ! -f "$m" ] && [ -f "$t" ]; then
    # A run stopped between swap_manifest's two moves: the new one moves in.
    mv -f "$t" "$m"
  elif [ -f "$m" ] && grep -q '^  labels:$' "$m"; then
    sed -e '/^    kubexm.io\/restarted: /d' \
      -e "0,/^  labels:\$/s//  labels:\n    kubexm.io\/restarted: \"$(date +%s)\"/" "$m" > "$t" && chmod --reference="$m" "$t" && swap_manifest "$m" "$t" "$c" || return 1
  elif [ -n "$old" ]; then
    stop_process "$old"
  fi
  within 180 "$c did not run again within 180 s of its restart; look at: journalctl -u kubelet" runs_again "$c" "$old" "$want" || return 1
  echo "$c restarted"
}
# The API server first; then the others side by side (each its own pod,
# each waiting for its own old pod), each in a subshell of its own.
restart() {
  pids=
  for pair in {{PODS}}; do
    if [ "${pair%%=*}" = kube-apiserver ]; then
      replace "$pair" || return 1
    else
      replace "$pair" &
      pids="$pids $!"
    fi
  done
  failed=
  for p in $pids; do wait "$p" || failed=1; done
  [ -z "$failed" ] || return 1
  within 180 "the API server at {{SERVER}} is not ready 180 s after its restart; look at: journalctl -u kubelet" api_ready || return 1
}
{{TAIL}}
