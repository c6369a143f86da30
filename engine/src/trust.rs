//! How far a run trusts its config's references to the machine it runs on.
//!
//! A config the operator types on the worker's machine may name files,
//! environment variables, key paths and the SSH agent there, and a host's
//! key is pinned on first contact. A request that arrived over the API, or
//! through a job database other machines share, is hostile: it names
//! secrets only as server-side credentials (each with the addresses it may
//! be offered to), and a host is connected to only when an operator pinned
//! its key. Nothing of the worker's machine is read on its behalf.

use std::sync::Arc;

use crate::ssh::{Credential, KnownHosts};

/// Named credentials held by the server, decrypted on the worker.
pub trait Credentials: Send + Sync {
    /// The credential `name`, for `host` at `address`: refused when there
    /// is no such credential or `address` is outside its allow-list.
    fn resolve(&self, name: &str, host: &str, address: &str) -> Result<Credential, String>;
}

/// What a run may use of the worker's machine.
#[derive(Clone, Default)]
pub enum Trust {
    /// The operator's own config: files, variables, key paths and the agent
    /// are read; unknown host keys are pinned on first contact.
    #[default]
    Local,
    /// A request: only named credentials, only operator-pinned host keys.
    Untrusted {
        credentials: Arc<dyn Credentials>,
        /// The host keys an operator pinned (`kubexm host-key add`).
        pinned: Arc<dyn KnownHosts>,
    },
}

impl Trust {
    pub fn is_local(&self) -> bool {
        matches!(self, Trust::Local)
    }
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_local() { "Local" } else { "Untrusted" })
    }
}
