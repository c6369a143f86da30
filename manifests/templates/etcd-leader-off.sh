# kubexm: etcd member {{NAME}} ({{PEER}}) hands its leadership to another
# member before it restarts (an upgrade's new binary): the cluster keeps a
# leader throughout. Written by kubexm-install; the last line, {{TAIL}}, is
# `! leads` (the check) or `move_off`. Safe to re-run.
ctl() { {{CTL}} "$@"; }
{{MOVE_LEADER}}
{{TAIL}}
