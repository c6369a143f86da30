# kubexm reset: undo what kubexm-install put on this host. Packages installed
# from the bundle's repositories stay (other software may use them); their
# kubexm configs go.
systemctl stop kubelet 2>/dev/null
if [ -x /usr/local/bin/kubeadm ]; then /usr/local/bin/kubeadm reset -f >/dev/null 2>&1; fi
for u in kubexm-etcd-backup.timer kubelet kubexm-etcd kubexm-registry containerd; do
  systemctl disable -q --now "$u" 2>/dev/null
done
for u in haproxy keepalived; do
  for f in /etc/haproxy/haproxy.cfg /etc/keepalived/keepalived.conf; do
    if grep -qs 'Written by kubexm' "$f" && [ "$(basename "$(dirname "$f")")" = "$u" ]; then
      systemctl disable -q --now "$u" 2>/dev/null; rm -f "$f"
    fi
  done
done
# Shims outlive containerd; -x matches the process name (comm), never this script.
pkill -x containerd-shim 2>/dev/null
# Only what is mounted below them: the directories themselves may be the
# operator's own mounts (a disk for containerd's images), which stay.
grep -o ' /run/containerd/[^ ]*\| /var/lib/containerd/[^ ]*\| /var/lib/kubelet/[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
# The pod network: the CNI's interfaces, the pods' network namespaces, and
# the iptables chains kube-proxy, kubelet and the CNI wrote (with the rules
# jumping to them); the host's own rules stay.
for l in cni0 flannel.1 kube-ipvs0 tunl0 vxlan.calico kube-bridge; do ip link delete "$l" 2>/dev/null; done
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns delete "$ns" 2>/dev/null; done
for t in iptables ip6tables; do
  if command -v "$t-save" >/dev/null && "$t-save" 2>/dev/null | grep -qE 'KUBE-|FLANNEL|CNI-'; then
    "$t-save" | grep -vE 'KUBE-|FLANNEL|CNI-' | "$t-restore"
  fi
done
# etcd's data directory goes only on etcd hosts, and only when it holds etcd's
# member/ (a mistyped dataDir never takes anything else with it).
{{ETCD_WIPE}}
rm -rf /etc/kubernetes /var/lib/kubelet /etc/kubexm /var/lib/kubexm /etc/containerd /var/lib/containerd /run/containerd \
  /opt/cni /etc/cni/net.d /var/lib/cni /run/flannel /var/log/kubexm \
  /etc/systemd/system/kubelet.service /etc/systemd/system/kubelet.service.d /etc/systemd/system/kubexm-etcd.service \
  /etc/systemd/system/kubexm-registry.service /etc/systemd/system/containerd.service \
  /etc/systemd/system/kubexm-etcd-backup.service /etc/systemd/system/kubexm-etcd-backup.timer \
  /etc/sysctl.d/90-kubexm-kubernetes.conf /etc/modules-load.d/kubexm-kubernetes.conf
for b in kubeadm kubelet kubectl etcd etcdctl etcdutl crictl containerd containerd-shim containerd-shim-runc-v1 containerd-shim-runc-v2 containerd-stress ctr kubexm-install; do
  rm -f "/usr/local/bin/$b"
done
rm -f /usr/local/sbin/runc
if grep -q '# kubexm control-plane endpoint' /etc/hosts; then
  grep -v '# kubexm control-plane endpoint' /etc/hosts > /etc/hosts.kubexm.tmp; cat /etc/hosts.kubexm.tmp > /etc/hosts; rm -f /etc/hosts.kubexm.tmp
fi
systemctl daemon-reload
echo "reset: kubexm's services, files and binaries removed"
