# kubexm: etcd member {{NAME}} ({{PEER}}) leaves the cluster, through the
# members that stay ({{ENDPOINTS}}): leadership moved off it first when it
# leads (and answers), then the member removed. Written by kubexm-install;
# the last line, {{TAIL}}, is `gone` (the check) or `remove`. Safe to re-run.
ctl() { {{CTL}} "$@"; }
line() { ctl member list 2>/dev/null | awk -F', ' -v u={{PEER}} '$4 == u'; }
gone() { out=$(ctl member list 2>&1) && ! printf '%s\n' "$out" | awk -F', ' -v u={{PEER}} '$4 == u' | grep -q .; }
{{MOVE_LEADER}}
remove() {
  out=$(ctl member list 2>&1) || { echo "etcd does not answer through {{ENDPOINTS}}: $out" >&2; return 1; }
  id=$(line | cut -d, -f1)
  [ -n "$id" ] || { echo "{{NAME}} is not an etcd member"; return 0; }
  move_off || return 1
  [ -n "$st" ] || echo "{{NAME}} does not answer: removed without moving leadership"
  # Refused as "unhealthy cluster" while the member asked has not been
  # connected to enough of the others for 5 s: asked again for a minute.
  t0=$(date +%s)
  until out=$(ctl member remove "$id" 2>&1); do
    case "$out" in *"unhealthy cluster"*) ;; *) echo "$out" >&2; return 1 ;; esac
    if [ $(( $(date +%s) - t0 )) -ge 60 ]; then
      echo "etcd refused to remove {{NAME}} for 60 s: $out; check the members that stay (etcdctl endpoint health) and run the command again" >&2
      return 1
    fi
    sleep 2
  done
  echo "{{NAME}} ($id) removed"
}
{{TAIL}}
