# kubexm: shell helpers of the scripts that replace a control-plane node's
# static pod (included by kubexm-install where a script says so).
#
# within SECONDS MESSAGE COMMAND...: COMMAND run every second until it
# succeeds; after SECONDS, MESSAGE goes to stderr and it fails.
within() {
  limit=$1; msg=$2; shift 2
  w0=$(date +%s)
  until "$@"; do
    if [ $(( $(date +%s) - w0 )) -ge "$limit" ]; then echo "$msg" >&2; return 1; fi
    sleep 1
  done
}
# stop_process PID: SIGTERM, 5 s for what it serves, then SIGKILL.
stop_process() {
  kill "$1" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$1" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$1" 2>/dev/null || true
}
# beside MANIFEST: where its new version waits (a hidden file the kubelet
# ignores) until swap_manifest moves it in.
beside() { echo "$(dirname "$1")/.$(basename "$1").kubexm"; }
# unfinished MANIFEST: a run stopped between swap_manifest's two moves left
# only the new version beside it; it moves in.
unfinished() { [ -f "$1" ] || [ ! -f "$(beside "$1")" ] || mv -f "$(beside "$1")" "$1"; }
# The UID of the pod process $1 runs in (its cgroup names it), or nothing.
pod_uid() { grep -o 'pod[0-9a-f_-]\{16,\}' "/proc/$1/cgroup" 2>/dev/null | head -1 | sed 's/^pod//; s/_/-/g'; }
# swap_manifest MANIFEST NEW COMMAND: the static pod of MANIFEST replaced
# by the one NEW describes (`beside MANIFEST`; a run stopped half-way
# leaves one of the two, and the caller runs `unfinished MANIFEST` first). The manifest goes,
# the old process (its command line starts with COMMAND) gets 5 s for what
# it serves and is then killed, the kubelet is given time to finish the old
# pod (its directory under /var/lib/kubelet/pods gone, then a second), and
# only then does NEW move in: the kubelet starts a static pod only once no
# other of the same name is still terminating, and otherwise tries again 10
# to 15 s later (what made every restart here take 15 to 21 s). Without an
# old process (one that keeps crashing) there is nothing to wait for, and
# the kubelet may take those 10 to 15 s. The wait for the directory is cut
# at 15 s, the longest the kubelet's own retry would take.
swap_manifest() {
  m=$1; new=$2; c=$3
  old=$(pgrep -of "^$c( |\$)") || old=
  uid=
  if [ -n "$old" ]; then uid=$(pod_uid "$old"); fi
  rm -f "$m"
  if [ -n "$old" ]; then stop_process "$old"; fi
  if [ -n "$uid" ]; then
    for _ in $(seq 30); do [ -d "/var/lib/kubelet/pods/$uid" ] || break; sleep 0.5; done
    sleep 1
  fi
  mv -f "$new" "$m"
}
