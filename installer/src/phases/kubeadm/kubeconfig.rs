//! The `kubeconfig` phase, the hand-over: the admin kubeconfig for the
//! user, the temporary files (kubeadm configs holding the token) removed from
//! every host, and no credential left in a kubeadm log.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{CONFIG_DIR, logs_redacted};
use crate::context::Context;
use crate::engine::plan::{Check, Module, Scope, Step, StepError, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::Transport;
use crate::paths::{ADMIN_CONF, HOST_FILES};
use crate::pki;

/// The admin kubeconfig from the first control-plane node, its server set to
/// an address the user's machine reaches, written locally (0600) whole or
/// not at all. Its content never enters a log.
pub struct FetchKubeconfig {
    pub local: std::path::PathBuf,
    pub server: String,
}

impl FetchKubeconfig {
    async fn wanted(&self, t: &dyn Transport) -> Result<Vec<u8>, StepError> {
        let out = t.run(&format!("cat {ADMIN_CONF}"), Duration::from_secs(30)).await?;
        if !out.success() {
            return Err(StepError::Failed(format!(
                "{ADMIN_CONF} is missing: run the control-plane phase first"
            )));
        }
        let mut text = String::new();
        for line in out.stdout.split_inclusive('\n') {
            let body = line.trim_start();
            if body.starts_with("server: ") {
                let indent = &line[..line.len() - body.len()];
                text.push_str(&format!("{indent}server: {}\n", self.server));
            } else {
                text.push_str(line);
            }
        }
        Ok(text.into_bytes())
    }
}

impl Step for FetchKubeconfig {
    fn name(&self) -> &str {
        "admin-kubeconfig"
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let want = self.wanted(t).await?;
            Ok(match fs_err::read(&self.local) {
                Ok(have) if have == want => Check::Holds,
                _ => Check::Missing,
            })
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let want = self.wanted(t).await?;
            if let Some(dir) = self.local.parent() {
                fs_err::create_dir_all(dir).map_err(|e| StepError::Failed(e.to_string()))?;
            }
            pki::write_private(&self.local, &want).map_err(|e| StepError::Failed(e.to_string()))?;
            Ok(format!("wrote {} (server {})", self.local.display(), self.server))
        })
    }
}

/// Hand-over: the admin kubeconfig for the user, the temporary files
/// (kubeadm configs holding the token) removed from every host, and no
/// credential left in a kubeadm log.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let first = i.topo.first_control_plane.clone();
    let mut tasks = vec![Task {
        name: "admin-kubeconfig".into(),
        hosts: vec![first],
        steps: vec![Arc::new(FetchKubeconfig {
            local: i.kubeconfig.to_path_buf(),
            server: i.topo.external_server.clone(),
        })],
        after: vec![],
    }];
    let temp = format!("{CONFIG_DIR}/*.yaml {HOST_FILES}");
    tasks.push(Task {
        name: "remove-temporary-files".into(),
        hosts: i.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect(),
        steps: vec![
            Arc::new(Shell::new(
                "remove-temporary-files",
                Some(&format!("! ls -d {temp} >/dev/null 2>&1")),
                &format!("rm -rf {temp}"),
            )),
            logs_redacted(),
        ],
        after: vec![("admin-kubeconfig".into(), Scope::AllHosts)],
    });
    Ok(Module {
        name: "kubeconfig".into(),
        tasks,
    })
}
