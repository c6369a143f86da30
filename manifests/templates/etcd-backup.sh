#!/bin/sh
# kubexm: a snapshot of this etcd member, run by kubexm-etcd-backup.timer.
# Written by kubexm-install; do not edit. Keeps the newest {{KEEP}} in {{DIR}}.
set -eu
umask 077
dir={{DIR}}
name={{NAME_Q}}
mkdir -p "$dir"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
file="$dir/$name-$stamp.db"
# etcdctl writes FILE.part and renames it whole; a failed run leaves none.
trap 'rm -f "$file.part"' EXIT
ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 --cacert={{PKI}}/ca.crt \
  --cert={{PKI}}/client.crt --key={{PKI}}/client.key snapshot save "$file" >/dev/null
(cd "$dir" && sha256sum "$(basename "$file")" > "$(basename "$file").sha256")
# The newest {{KEEP}} stay; older ones go with their .sha256.
ls -1 "$dir" | grep -E "^$name-[0-9]{8}T[0-9]{6}Z\\.db\$" | sort -r | tail -n +$(({{KEEP}} + 1)) | while read -r old; do
  rm -f "$dir/$old" "$dir/$old.sha256"
done
echo "etcd snapshot $file"
