# Leadership of etcd member {{NAME}} ({{PEER}}): `leads` asks it alone
# (member_id and leader, in decimal; $st empty when it does not answer);
# `move_off` hands leadership, when it leads, to a started voting member of
# {{ENDPOINTS}} that answers. Needs ctl() (etcdctl to the cluster).
leads() {
  st=$({{CTL_ALONE}} endpoint status -w json 2>/dev/null | tr -d ' \n')
  me=$(printf '%s' "$st" | grep -o '"member_id":[0-9]*' | head -1 | cut -d: -f2)
  leader=$(printf '%s' "$st" | grep -o '"leader":[0-9]*' | head -1 | cut -d: -f2)
  [ -n "$me" ] && [ "$me" = "$leader" ]
}
move_off() {
  leads || return 0
  to=
  for m in $(ctl member list | awk -F', ' -v u={{PEER}} '$4 != u && $2 == "started" && $6 == "false" { print $1 "=" $5 }'); do
    case ",{{ENDPOINTS}}," in *",${m#*=},"*) ;; *) continue ;; esac
    {{ETCDCTL}} --endpoints="${m#*=}" --command-timeout=5s endpoint health >/dev/null 2>&1 && { to=${m%%=*}; break; }
  done
  [ -n "$to" ] || { echo "no other member answers to take etcd's leadership from {{NAME}}: check them (etcdctl endpoint health) and run the command again" >&2; return 1; }
  {{CTL_ALONE}} move-leader "$to" || return 1
  echo "leadership moved from {{NAME}} to $to"
}
