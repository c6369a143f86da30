//! How steps reach a host: run a command, put a file. Behind a trait so the
//! plan and the engine are tested on a recording fake and run for real over
//! SSH with the same steps.

use std::time::Duration;

use futures_util::future::BoxFuture;

/// What a command left behind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmdOutput {
    /// The exit status; `None` if the command was killed by a signal.
    pub code: Option<u32>,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    #[error("{host}: cannot connect to {address}: {why}")]
    Connect { host: String, address: String, why: String },
    #[error("{host}: authentication as {user} failed ({method}); check the credentials in cluster.yaml")]
    Auth { host: String, user: String, method: String },
    #[error(
        "{host}: the host key changed (known {known}, offered {offered}). This is what a man-in-the-middle looks like; if the host was reinstalled, re-run with --accept-new-host-key"
    )]
    HostKeyChanged { host: String, known: String, offered: String },
    #[error("{host}: `{command}` did not finish within {seconds} s")]
    Timeout { host: String, command: String, seconds: u64 },
    #[error(
        "{host}: `{command}` printed more than {mib} MiB of output; kubexm closed its channel there and counts it failed (a command should print far less: check what it runs on the host)"
    )]
    OutputLimit { host: String, command: String, mib: u64 },
    #[error("{host}: the SSH session failed: {why}")]
    Session { host: String, why: String },
    #[error(
        "{host}: the host became unreachable: the SSH connection was lost ({why}). The host is down, its network was cut or its sshd stopped; bring it back and re-run: steps already done are skipped"
    )]
    Lost { host: String, why: String },
    #[error("{host}: uploading {path}: {why}")]
    Upload { host: String, path: String, why: String },
    #[error("{host}: copying {path} from the host: {why}")]
    Download { host: String, path: String, why: String },
    #[error(
        "{host}: no host key is pinned for {endpoint}, and a job from a request connects only to hosts whose key an operator pinned; it was not connected to. Pin it on the server: `kubexm host-key scan {endpoint}` (check the key it shows), or `kubexm host-key add {endpoint} 'ssh-ed25519 AAAA...'`"
    )]
    Unpinned { host: String, endpoint: String },
}

impl TransportError {
    /// Whether the host itself is gone (no later step on it can run).
    pub fn lost(&self) -> bool {
        matches!(self, TransportError::Lost { .. })
    }

    /// Whether trying again may help (a dropped connection, not bad credentials).
    pub fn transient(&self) -> bool {
        matches!(
            self,
            TransportError::Connect { .. } | TransportError::Session { .. } | TransportError::Timeout { .. }
        )
    }
}

/// One connection to one host.
pub trait Transport: Send + Sync {
    /// The host's name in the config.
    fn host(&self) -> &str;
    /// Runs a shell command (as root: through sudo for other users).
    fn run<'a>(&'a self, command: &'a str, timeout: Duration) -> BoxFuture<'a, Result<CmdOutput, TransportError>>;
    /// Writes `data` to `path` with `mode`, whole or not at all, and checks its sha256 on the host.
    fn put<'a>(&'a self, data: &'a [u8], path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), TransportError>>;
    /// Writes the local file `local` to `path` with `mode`, read and sent in
    /// chunks (a bundle is gigabytes: never whole in memory), whole or not
    /// at all; `sha256` is what it must hash to, on the host and as sent.
    fn put_file<'a>(
        &'a self,
        local: &'a std::path::Path,
        sha256: &'a str,
        path: &'a str,
        mode: u32,
    ) -> BoxFuture<'a, Result<(), TransportError>>;
    /// Copies the host's file `path` (as root reads it) to the local file
    /// `local`, in chunks, whole or not at all (a temporary file beside it,
    /// renamed once its sha256 matched the host's); returns that sha256.
    fn get_file<'a>(&'a self, path: &'a str, local: &'a std::path::Path) -> BoxFuture<'a, Result<String, TransportError>> {
        let _ = local;
        Box::pin(async move {
            Err(TransportError::Download {
                host: self.host().to_string(),
                path: path.to_string(),
                why: "this transport copies no file from a host".into(),
            })
        })
    }
    /// After a step failed: whether the host is going away (shutting down,
    /// or the connection already lost), which explains the failure better
    /// than the step's own error. Asked only after failures.
    fn going_away(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { false })
    }
}

/// Quotes a string for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
