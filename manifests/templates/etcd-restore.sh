# kubexm: etcd member {{NAME}} restored from a snapshot (`etcd restore`),
# run by kubexm-install over SSH while every member is stopped. The member's
# data before is kept beside it; the snapshot copy goes once restored.
set -eu
snap={{SNAPSHOT}}
data={{DATA_DIR}}
new="$data.kubexm-restore"
rm -rf "$new"
{{TOOL}}
# The copy is the snapshot that was checked on the installer's machine.
echo "{{SHA256}}  $snap" | sha256sum -c --quiet - || { echo "$snap is not the snapshot checked (sha256 {{SHA256}}): copy it again by running the restore again" >&2; exit 1; }
# Where the tool can, the revision moves past every one clients saw and
# those are marked compacted, so their watches and caches start over
# instead of reading state that is gone (etcd's advice for Kubernetes).
fresh=
if $restore snapshot restore --help 2>&1 | grep -q -- '--mark-compacted'; then
  fresh="--bump-revision 1000000000 --mark-compacted"
fi
$restore snapshot restore "$snap" --name {{NAME}} --initial-cluster {{INITIAL_CLUSTER}} \
  --initial-cluster-token {{TOKEN}} --initial-advertise-peer-urls https://{{ADDRESS}}:2380 \
  --data-dir "$new" $fresh >/dev/null
chmod 700 "$new"
old="$data.before-restore-{{STAMP}}"
if [ -e "$data" ]; then mv "$data" "$old"; fi
mv "$new" "$data"
rm -f "$snap"
echo "restored into $data; its data before: $old"
