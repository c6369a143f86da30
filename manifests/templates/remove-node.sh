# kubexm remove node: cordon node {{NODE}} and drain it, through the admin
# kubeconfig of this control-plane node (an unreachable node is cordoned
# only: its kubelet cannot stop anything, and the pods of a deleted Node are
# removed by Kubernetes' pod garbage collector). The Node is deleted by a
# later step, once its host is reset (a running kubelet would register it
# again). Safe to re-run: a Node already gone is done.
k="kubectl --kubeconfig {{ADMIN_CONF}}"
n={{NODE}}
if ! $k get node "$n" -o name >/dev/null 2>&1; then
  # Not found is done; any other error (the API server down) is a failure.
  if $k get node "$n" 2>&1 | grep -q NotFound; then echo "node $n is not in the cluster"; exit 0; fi
  $k get node "$n" >&2; exit 1
fi
$k cordon "$n" >/dev/null || exit 1
t0=$(date +%s)
if [ {{DRAIN}} = yes ]; then
  out=$($k drain "$n" --ignore-daemonsets --delete-emptydir-data --timeout={{TIMEOUT}}s {{FORCE}} 2>&1)
  if [ $? -ne 0 ]; then
    # kubectl retries an eviction a PodDisruptionBudget refuses until the
    # timeout, printing: error when evicting pods/"NAME" -n "NS" (...): ...disruption budget.
    blocked=$(printf '%s\n' "$out" | grep 'disruption budget' | grep -o 'pods/"[^"]*" -n "[^"]*"' \
      | sed 's|pods/"\([^"]*\)" -n "\([^"]*\)"|\2/\1|' | sort -u | tr '\n' ' ')
    if [ -n "$blocked" ]; then
      echo "the drain of node $n was blocked by a PodDisruptionBudget for {{TIMEOUT}}s: pods ${blocked}would lose a replica they may not lose; the node stays cordoned. Free the budget, or pass --force-drain to delete them anyway" >&2
    else
      printf '%s\n' "$out" | tail -n 5 >&2
      echo "the drain of node $n failed (above); the node stays cordoned. --force-drain deletes what blocks it" >&2
    fi
    exit 1
  fi
  echo "node $n drained in $(( $(date +%s) - t0 ))s"
else
  echo "node $n is unreachable: cordoned, not drained; its pods are removed with the Node"
fi
