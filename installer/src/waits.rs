//! Bounded waits on the cluster, asked through the bundle's kubectl on a
//! control-plane node over SSH (the installer needs no path to the API
//! server). Each wait is a step whose check is one probe and whose apply
//! probes until it passes or its time is up; then it fails naming what is
//! not ready and where. A probe is a shell snippet that prints nothing when
//! all is ready and one line per thing that is not.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::plan::Step;
use crate::engine::steps::{Shell, Wait};
use crate::engine::transport::shell_quote as q;
use crate::paths::ADMIN_CONF;

/// kubectl with the admin kubeconfig (its server is the control-plane endpoint).
pub fn kubectl() -> String {
    format!("kubectl --kubeconfig {ADMIN_CONF}")
}

/// A step that waits up to `secs` for `probe` to print nothing.
pub fn wait(name: &str, what: &str, probe: &str, secs: u64) -> Arc<dyn Step> {
    let check = format!("[ -z \"$({probe})\" ]");
    let apply = format!(
        "deadline=$((SECONDS + {secs}))\n\
         while :; do\n  \
           out=$({probe})\n  \
           [ -z \"$out\" ] && exit 0\n  \
           if [ $SECONDS -ge $deadline ]; then\n    \
             printf '%s not ready after {secs} s:\\n%s\\nlook closer on this host with {k} (describe, logs), fix the cause and run again: done steps are skipped\\n' {what} \"$out\" >&2; exit 1\n  \
           fi\n  \
           sleep 1\n\
         done",
        what = q(what),
        k = kubectl()
    );
    Arc::new(Wait {
        what: what.into(),
        shell: Shell {
            name: name.into(),
            check: Some(check),
            apply,
            timeout: Duration::from_secs(secs + 60),
        },
    })
}

/// What kubectl's error says while the API server cannot be reached (a
/// static pod restarted by a new kubelet, a control plane being upgraded)
/// or cannot authorize yet (an API server just restarted answers Forbidden
/// until its authorizer has read the RBAC objects: seen after `kubeadm
/// upgrade apply` on a loaded machine): worth asking again.
const NOT_YET: [&str; 7] = [
    "refused",
    "i/o timeout",
    "TLS handshake timeout",
    "EOF",
    "currently unable",
    "no route to host",
    "is forbidden: User",
];

/// Whether kubectl's error `stderr` is one of [`NOT_YET`].
pub fn not_yet(stderr: &str) -> bool {
    NOT_YET.iter().any(|p| stderr.contains(p))
}

/// Shell running kubectl command `cmd` again, every 2 s for up to `secs`,
/// while its error is one of [`NOT_YET`]; any other error, or the last
/// one, is printed and fails at once.
pub fn retried(cmd: &str, secs: u64) -> String {
    let patterns: Vec<String> = NOT_YET.iter().map(|p| format!("*{}*", q(p))).collect();
    format!(
        "deadline=$((SECONDS + {secs}))\n\
         until out=$({cmd} 2>&1); do\n  \
           case \"$out\" in {}) ;; \
           *) printf '%s\\n' \"$out\" >&2; exit 1;; esac\n  \
           if [ $SECONDS -ge $deadline ]; then printf '%s\\n(the API server did not answer for {secs} s)\\n' \"$out\" >&2; exit 1; fi\n  \
           sleep 2\n\
         done\n\
         printf '%s\\n' \"$out\"",
        patterns.join("|")
    )
}

/// Probe: the API server answers `/readyz` at `server` (or the kubeconfig's).
pub fn api_server(server: Option<&str>) -> String {
    let at = server.map(|s| format!(" --server {}", q(s))).unwrap_or_default();
    format!(
        "e=$({k}{at} get --raw=/readyz --request-timeout=5s 2>&1 >/dev/null) || \
         echo \"  API server{shown}: $(printf '%s\\n' \"$e\" | tail -1)\"",
        k = kubectl(),
        shown = server
            .map(|s| format!(" at {s}"))
            .unwrap_or_else(|| " at the control-plane endpoint".into())
    )
}

/// Probe: each node is registered and Ready (else its Ready condition's message).
pub fn nodes_ready(nodes: &[String]) -> String {
    let jsonpath = "{range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}:{.status.conditions[?(@.type==\"Ready\")].message}{\"\\n\"}{end}";
    format!(
        "st=$({k} get nodes -o jsonpath={jp} 2>&1) || {{ echo \"  nodes: $st\" | tail -1; exit 0; }}; \
         for n in {names}; do l=$(printf '%s\\n' \"$st\" | grep \"^$n=\"); \
           case \"$l\" in \"$n=True:\"*) ;; '') echo \"  $n: not registered\";; *) echo \"  $n: ${{l#*:}}\";; esac; done",
        k = kubectl(),
        jp = q(jsonpath),
        names = nodes.iter().map(|n| q(n)).collect::<Vec<_>>().join(" ")
    )
}

/// Probe: a Deployment has rolled out; otherwise its ready count and the
/// pods that are not running, with their nodes.
pub fn deployment_available(namespace: &str, name: &str) -> String {
    let k = kubectl();
    let (ns, n) = (q(namespace), q(name));
    format!(
        "if ! {k} -n {ns} rollout status deployment/{n} --timeout=1s >/dev/null 2>&1; then \
           echo \"  deployment {namespace}/{name}: $({k} -n {ns} get deployment {n} --no-headers 2>&1 | tail -1)\"; \
           {k} -n {ns} get pods -o wide --no-headers 2>/dev/null | awk -v p={prefix} \
             'index($1, p) == 1 {{ split($2, r, \"/\"); if ($3 != \"Running\" || r[1] != r[2]) print \"    pod \" $1 \" on \" $(NF-2) \": \" $3 }}'; \
         fi",
        prefix = q(&format!("{name}-"))
    )
}

/// Probe: the DaemonSet's pod on each of `nodes` is running and ready;
/// otherwise which node lacks it or what its pod's status is. A pod's node
/// is the third field from the end of `-o wide` (NODE, NOMINATED NODE,
/// READINESS GATES): RESTARTS is two fields once a container restarted
/// (`1 (2m ago)`), so counting from the start finds the wrong one.
pub fn daemonset_on(namespace: &str, name: &str, nodes: &[String]) -> String {
    let k = kubectl();
    format!(
        "pods=$({k} -n {ns} get pods -o wide --no-headers 2>&1) || {{ echo \"  daemonset {namespace}/{name}: $pods\" | tail -1; exit 0; }}; \
         for n in {names}; do \
           l=$(printf '%s\\n' \"$pods\" | awk -v p={prefix} -v n=\"$n\" 'index($1, p) == 1 && $(NF-2) == n'); \
           case \"$l\" in \
             '') echo \"  daemonset {namespace}/{name}: no pod on $n\";; \
             *) echo \"$l\" | awk '{{ split($2, r, \"/\"); if ($3 != \"Running\" || r[1] != r[2]) print \"  daemonset {namespace}/{name}: pod \" $1 \" on \" $(NF-2) \": \" $3 }}';; \
           esac; \
         done",
        ns = q(namespace),
        prefix = q(&format!("{name}-")),
        names = nodes.iter().map(|n| q(n)).collect::<Vec<_>>().join(" ")
    )
}

/// The DaemonSets and Deployments in manifests (kind, namespace, name),
/// lowercased kind as `kubectl rollout` takes it.
pub fn workloads(manifests: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (_, v) in documents(manifests) {
        let kind = match v.get("kind").and_then(|k| k.as_str()) {
            Some("DaemonSet") => "daemonset",
            Some("Deployment") => "deployment",
            _ => continue,
        };
        let meta = v.get("metadata");
        let name = meta.and_then(|m| m.get("name")).and_then(|n| n.as_str());
        let ns = meta.and_then(|m| m.get("namespace")).and_then(|n| n.as_str()).unwrap_or("default");
        if let Some(name) = name {
            out.push((kind.to_string(), ns.to_string(), name.to_string()));
        }
    }
    out
}

/// The YAML documents of a multi-document manifest, each as its text and
/// parsed (documents that do not parse, such as empty ones, are left out).
pub fn documents(manifests: &str) -> Vec<(&str, serde_json::Value)> {
    manifests
        .split("\n---")
        .filter_map(|doc| Some((doc, serde_saphyr::from_str::<serde_json::Value>(doc).ok()?)))
        .filter(|(_, v)| v.is_object())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_found_in_multi_document_manifests() {
        let text = "kind: Namespace\napiVersion: v1\nmetadata: {name: x}\n---\napiVersion: apps/v1\nkind: DaemonSet\n\
                    metadata:\n  name: kube-flannel-ds\n  namespace: kube-flannel\n---\nkind: Deployment\nmetadata: {name: d}\n";
        assert_eq!(
            workloads(text),
            [
                ("daemonset".to_string(), "kube-flannel".to_string(), "kube-flannel-ds".to_string()),
                ("deployment".into(), "default".into(), "d".into())
            ]
        );
    }

    /// The DaemonSet probe as a shell runs it, with a `kubectl` printing
    /// `get pods -o wide` as a real one does: a pod whose container restarted
    /// (RESTARTS `1 (2m ago)`, two fields) is still found on its node; a pod
    /// not ready is named with its status; a node without a pod is named.
    #[test]
    fn a_restarted_daemonset_pod_is_found_on_its_node() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let fake = dir.path().join("kubectl");
        std::fs::write(
            &fake,
            "#!/bin/sh
cat <<'EOF'
\
             kube-flannel-ds-a   1/1   Running    1 (2m ago)   27s   198.18.0.12   lab2   <none>   <none>\n\
             kube-flannel-ds-b   0/1   Init:0/2   0            40s   198.18.0.11   lab1   <none>   <none>\n\
             EOF\n",
        )?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
        let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
        let nodes = ["lab1".to_string(), "lab2".into(), "lab3".into()];
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(daemonset_on("kube-flannel", "kube-flannel-ds", &nodes))
            .env("PATH", path)
            .output()?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            concat!(
                "  daemonset kube-flannel/kube-flannel-ds: pod kube-flannel-ds-b on lab1: Init:0/2\n",
                "  daemonset kube-flannel/kube-flannel-ds: no pod on lab3\n"
            )
        );
        Ok(())
    }

    /// The probes as a shell runs them, with a `kubectl` that fails like an
    /// API server that does not answer.
    #[test]
    fn an_unanswered_api_server_is_reported_with_kubectls_last_error_line() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let fake = dir.path().join("kubectl");
        std::fs::write(&fake, "#!/bin/sh\necho 'first line' >&2\necho 'connection refused' >&2\nexit 1\n")?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
        let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(api_server(Some("https://10.0.0.2:6443")))
            .env("PATH", path)
            .output()?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "  API server at https://10.0.0.2:6443: connection refused\n"
        );
        Ok(())
    }

    /// `retried` as a shell runs it: a command refused (the API server
    /// restarting), then Forbidden (its authorizer not ready), succeeds on
    /// its third try; one failing for another reason fails at once with its
    /// error.
    #[test]
    fn a_refused_command_is_tried_again_and_another_error_is_not() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let count = dir.path().join("count");
        let flaky = format!(
            "n=$(cat {c} 2>/dev/null || echo 0); echo $((n+1)) > {c}; \
             if [ $n = 0 ]; then echo 'The connection to the server lb:6443 was refused' >&2; false; \
             elif [ $n = 1 ]; then echo 'Error from server (Forbidden): nodes \"lab1\" is forbidden: User \"kubernetes-admin\" cannot get resource \"nodes\"' >&2; false; \
             else echo node/lab1 uncordoned; fi",
            c = count.display()
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(retried(&format!("sh -c {}", q(&flaky)), 30))
            .output()?;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "node/lab1 uncordoned\n");
        assert_eq!(std::fs::read_to_string(&count)?.trim(), "3");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(retried(
                "sh -c 'echo Error from server \\(NotFound\\): nodes lab9 not found >&2; false'",
                30,
            ))
            .output()?;
        assert!(!out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "Error from server (NotFound): nodes lab9 not found\n"
        );
        Ok(())
    }
}
