# kubexm: etcd member {{NAME}} joins the running cluster, on its own host
# (apply). Written by kubexm-install; the last line, {{TAIL}}, is one of:
# added (check), add (as a learner, through the members before it, and how
# it joins written to {{ENV}}), promoted (check), promote (to a voting member
# once it has caught up with the leader). Every part is safe to re-run: a
# member already added, or promoted, is left as it is.
ctl() { {{CTL}} "$@"; }
# Its line of `member list` (ID, status, name, peer URLs, client URLs,
# learner), found by its peer URL: a learner not started yet has no name.
line() { ctl member list 2>/dev/null | awk -F', ' -v u={{PEER}} '$4 == u'; }
added() { test -s {{ENV}} && [ -n "$(line)" ]; }
add() {
  out=$(ctl member list 2>&1) || { echo "etcd does not answer through {{ENDPOINTS}}: $out" >&2; return 1; }
  if [ -z "$(line)" ]; then
    # etcd refuses a change until the member asked has been connected to
    # every voting member for 5 s ("unhealthy cluster"): just after the
    # member before this one was promoted, it is not yet.
    t0=$(date +%s)
    until out=$(ctl member add {{NAME_Q}} --peer-urls={{PEER}} --learner 2>&1); do
      case "$out" in *"unhealthy cluster"* | *"not enough started members"*) ;; *) echo "$out" >&2; return 1 ;; esac
      [ -n "$(line)" ] && break
      if [ $(( $(date +%s) - t0 )) -ge {{WAIT}} ]; then
        echo "etcd did not take {{NAME}} as a learner within {{WAIT}} s: $out; check every member (etcdctl endpoint health) and run apply again" >&2
        return 1
      fi
      sleep 2
    done
    echo "{{NAME}} added as a learner after $(( $(date +%s) - t0 )) s"
  fi
  # Every member, this one by its name (etcd checks that the list is the
  # cluster's): how this member finds the cluster, as `member add` prints it.
  initial=$(ctl member list | awk -F', ' -v u={{PEER}} -v n={{NAME_Q}} '{ printf "%s%s=%s", s, ($4 == u ? n : $3), $4; s = "," }')
  umask 077
  printf 'KUBEXM_INITIAL_CLUSTER=%s\nKUBEXM_INITIAL_CLUSTER_STATE=existing\n' "$initial" > {{ENV}}.new &&
    mv -f {{ENV}}.new {{ENV}}
}
promoted() { line | awk -F', ' '$2 == "started" && $6 == "false"' | grep -q .; }
promote() {
  id=$(line | cut -d, -f1)
  [ -n "$id" ] || { echo "{{NAME}} is not in etcd's member list: run apply again to add it" >&2; return 1; }
  # etcd refuses until the learner has caught up with the leader's log.
  t0=$(date +%s)
  until out=$(ctl member promote "$id" 2>&1); do
    promoted && { echo "{{NAME}} is a voting member"; return 0; }
    if [ $(( $(date +%s) - t0 )) -ge {{WAIT}} ]; then
      echo "etcd did not promote learner {{NAME}} ($id) within {{WAIT}} s: $out; look at: journalctl -u kubexm-etcd on {{NAME}}, then run apply again" >&2
      return 1
    fi
    sleep 1
  done
  echo "{{NAME}} promoted after $(( $(date +%s) - t0 )) s: $out"
}
{{TAIL}}
