# kubexm: on a control-plane node (`certs renew`), which static pods' main
# process started before one of the files it reads was last written, and
# restarting them (their process stopped; the kubelet starts a new one).
# Written by kubexm-install; the last line, {{TAIL}}, is the check (none
# stale) or the restart (each stale pod restarted and waited for, one by one,
# then this node's API server answers again). procps only: pgrep, ps.
pid_of() { pgrep -of "^$1( |\$)"; }
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
    m=$(stat -c %Y "$f"); [ "$m" -gt "$n" ] && n=$m
  done
  echo "$n"
}
# The running pods whose process started before one of their files changed
# (a second of slack: ps counts whole seconds); a pod not running is left
# to the kubelet.
stale() {
  for pair in {{PODS}}; do
    c=${pair%%=*}
    pid_of "$c" >/dev/null || continue
    if [ "$(newest "${pair#*=}")" -gt $(( $(started "$c") + 1 )) ]; then echo "$c"; fi
  done
}
restart() {
  for pair in {{PODS}}; do
    c=${pair%%=*}
    stale | grep -qx "$c" || continue
    old=$(pid_of "$c")
    # A new pod, not a restarted container: a label of the manifest changes
    # (the kubelet would wait out a crash back-off of up to 5 minutes for a
    # container that exited before, as a controller-manager does when its
    # API server restarts).
    m={{MANIFESTS}}/$c.yaml
    if [ -f "$m" ] && grep -q '^  labels:$' "$m"; then
      # Written beside it as a dotfile (the kubelet reads no hidden file as
      # a static pod), then moved into place.
      t={{MANIFESTS}}/.$c.yaml.kubexm
      sed -e '/^    kubexm.io\/restarted: /d' \
        -e "0,/^  labels:\$/s//  labels:\n    kubexm.io\/restarted: \"$(date +%s)\"/" "$m" > "$t" && chmod --reference="$m" "$t" && mv -f "$t" "$m"
    fi
    # Five seconds for what it is serving, then it is stopped (a kube-apiserver
    # finishes its watches for up to a minute otherwise; clients go to the
    # other API servers meanwhile).
    kill "$old" 2>/dev/null || true
    for _ in 1 2 3 4 5; do kill -0 "$old" 2>/dev/null || break; sleep 1; done
    kill -9 "$old" 2>/dev/null || true
    want=$(newest "${pair#*=}")
    waited=0
    while :; do
      new=$(pid_of "$c") || new=
      if [ -n "$new" ] && [ "$new" != "$old" ] && [ $(( $(started "$c") + 1 )) -ge "$want" ]; then break; fi
      if [ "$waited" -ge 180 ]; then
        echo "$c did not run again within 180 s of its restart; look at: journalctl -u kubelet" >&2
        return 1
      fi
      sleep 1; waited=$((waited + 1))
    done
    echo "$c restarted"
  done
  waited=0
  until {{KUBECTL}} --server {{SERVER}} get --raw=/readyz --request-timeout=5s >/dev/null 2>&1; do
    if [ "$waited" -ge 180 ]; then
      echo "the API server at {{SERVER}} is not ready 180 s after its restart; look at: journalctl -u kubelet" >&2
      return 1
    fi
    sleep 1; waited=$((waited + 1))
  done
}
{{TAIL}}
