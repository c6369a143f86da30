//! From cluster.yaml hosts to SSH targets. Secrets are read here, and only
//! here: from the environment variable or file the config names (a local
//! run), or from the server's named credentials (a request, [`Trust`]);
//! each one is also handed to the state database so it is redacted from
//! every log.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{StreamExt, stream};
use kubexm_bom::config::Cluster;
use kubexm_bom::config::model::{Auth, SecretRef};

use crate::ssh::{self, Credential, KnownHosts, Target};
use crate::transport::{Transport, TransportError};
use crate::trust::Trust;

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("host {host}: {what}: environment variable {var} is not set; export it before running")]
    MissingEnv { host: String, what: String, var: String },
    #[error("host {host}: {what}: cannot read {path}: {why}")]
    MissingFile {
        host: String,
        what: String,
        path: String,
        why: String,
    },
    #[error("host {host} has no auth method (validation should have caught this)")]
    NoAuth { host: String },
    #[error(
        "host {host}: {what} names a file, variable or agent on the worker, which a request may not; name a server-side credential instead: `auth: {{credential: NAME}}` (`kubexm credential create`)"
    )]
    Untrusted { host: String, what: String },
    #[error("host {host}: {why}")]
    Credential { host: String, why: String },
}

fn secret(host: &str, what: &str, s: &SecretRef) -> Result<String, InventoryError> {
    match (&s.from_env, &s.from_file) {
        (Some(var), _) => std::env::var(var).map_err(|_| InventoryError::MissingEnv {
            host: host.into(),
            what: what.into(),
            var: var.clone(),
        }),
        (None, Some(path)) => fs_err::read_to_string(path)
            .map(|t| t.trim_end_matches(['\n', '\r']).to_string())
            .map_err(|e| InventoryError::MissingFile {
                host: host.into(),
                what: what.into(),
                path: path.display().to_string(),
                why: e.to_string(),
            }),
        (None, None) => Err(InventoryError::NoAuth { host: host.into() }),
    }
}

fn credential(
    host: &str,
    address: &str,
    auth: Option<&Auth>,
    trust: &Trust,
    secrets: &mut Vec<String>,
) -> Result<Credential, InventoryError> {
    let auth = auth.ok_or_else(|| InventoryError::NoAuth { host: host.into() })?;
    if let Trust::Untrusted { credentials, .. } = trust {
        let what = match (&auth.credential, &auth.password, &auth.private_key, auth.agent) {
            (Some(name), None, None, None | Some(false)) => {
                let c = credentials
                    .resolve(name, host, address)
                    .map_err(|why| InventoryError::Credential { host: host.into(), why })?;
                match &c {
                    Credential::Password(p) => secrets.push(p.clone()),
                    Credential::KeyData { pem, passphrase } => {
                        secrets.push(pem.clone());
                        secrets.extend(passphrase.clone());
                    }
                    _ => {}
                }
                return Ok(c);
            }
            (_, Some(_), _, _) => "auth.password",
            (_, _, Some(_), _) => "auth.privateKey",
            (_, _, _, Some(true)) => "auth.agent",
            _ => return Err(InventoryError::NoAuth { host: host.into() }),
        };
        return Err(InventoryError::Untrusted {
            host: host.into(),
            what: what.into(),
        });
    }
    if let Some(name) = &auth.credential {
        return Err(InventoryError::Credential {
            host: host.into(),
            why: format!(
                "auth.credential {name:?} is a server-side credential, used by jobs run by `kubexm` workers; kubexm-install reads password, privateKey or agent"
            ),
        });
    }
    if let Some(pw) = &auth.password {
        let p = secret(host, "password", pw)?;
        secrets.push(p.clone());
        return Ok(Credential::Password(p));
    }
    if let Some(k) = &auth.private_key {
        let passphrase = match &k.passphrase {
            Some(s) => {
                let p = secret(host, "key passphrase", s)?;
                secrets.push(p.clone());
                Some(p)
            }
            None => None,
        };
        let path = expand_home(&k.path);
        return Ok(Credential::Key { path, passphrase });
    }
    if auth.agent == Some(true) {
        return Ok(Credential::Agent);
    }
    Err(InventoryError::NoAuth { host: host.into() })
}

fn expand_home(p: &std::path::Path) -> std::path::PathBuf {
    match (p.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => std::path::PathBuf::from(home).join(rest),
        _ => p.to_path_buf(),
    }
}

/// SSH targets for every host of a completed config, and the secrets they
/// hold; under [`Trust::Untrusted`] only named credentials are used.
pub fn targets(cluster: &Cluster, trust: &Trust) -> Result<(Vec<Target>, Vec<String>), InventoryError> {
    let mut secrets = Vec::new();
    let mut out = Vec::new();
    for h in &cluster.spec.hosts {
        let bastion = match &h.bastion {
            Some(b) => Some(Box::new(Target {
                name: format!("{} (bastion {})", h.name, b.address),
                address: b.address.clone(),
                port: b.port.unwrap_or(22),
                user: b.user.clone().unwrap_or_else(|| "root".into()),
                credential: credential(&h.name, &b.address, b.auth.as_ref(), trust, &mut secrets)?,
                bastion: None,
                host_key: None,
            })),
            None => None,
        };
        out.push(Target {
            name: h.name.clone(),
            address: h.address.clone(),
            port: h.port.unwrap_or(22),
            user: h.user.clone().unwrap_or_else(|| "root".into()),
            credential: credential(&h.name, &h.address, h.auth.as_ref(), trust, &mut secrets)?,
            bastion,
            host_key: h.host_key.as_deref().and_then(|k| kubexm_bom::net::host_key(k).ok()),
        });
    }
    Ok((out, secrets))
}

/// The host keys the operator's own config gives (`hosts[].hostKey`) over
/// the pins first contact made: the config's key is the one checked.
struct Given {
    inner: Arc<dyn KnownHosts>,
    given: HashMap<String, String>,
}

impl Given {
    fn over(inner: Arc<dyn KnownHosts>, targets: &[Target]) -> Arc<dyn KnownHosts> {
        let given: HashMap<String, String> = targets
            .iter()
            .filter_map(|t| Some((format!("{}:{}", t.address, t.port), t.host_key.clone()?)))
            .collect();
        if given.is_empty() {
            return inner;
        }
        Arc::new(Given { inner, given })
    }
}

impl KnownHosts for Given {
    fn get(&self, endpoint: &str) -> Option<String> {
        self.given.get(endpoint).cloned().or_else(|| self.inner.get(endpoint))
    }
    fn put(&self, endpoint: &str, key: &str) {
        self.inner.put(endpoint, key);
    }
}

/// The transports of the hosts that answered, and an error per one that did not.
pub type Connected = (HashMap<String, Arc<dyn Transport>>, Vec<TransportError>);

/// How a job opens its hosts' transports: over SSH ([`Ssh`]), or a test's
/// fake. Asked only for the hosts the job may touch.
pub trait Connector: Send + Sync {
    /// A transport per target that answered, and an error per one that did not.
    fn connect<'a>(&'a self, targets: &'a [Target], known: Arc<dyn KnownHosts>) -> BoxFuture<'a, Connected>;
}

/// Connects over SSH ([`connect_all`]).
pub struct Ssh(pub crate::jobs::ConnectOptions);

impl Connector for Ssh {
    fn connect<'a>(&'a self, targets: &'a [Target], known: Arc<dyn KnownHosts>) -> BoxFuture<'a, Connected> {
        Box::pin(connect_all(targets, known, &self.0, &self.0.trust))
    }
}

/// Connects to every target, `concurrency` at a time; a failed host does not
/// stop the others. Under [`Trust::Untrusted`] the keys come from the
/// operator's pins, and a host (or bastion) with no pinned key is never
/// connected to.
pub async fn connect_all(targets: &[Target], known: Arc<dyn KnownHosts>, o: &crate::jobs::ConnectOptions, trust: &Trust) -> Connected {
    let (accept_new_key, concurrency, timeout, attempts) = (o.accept_new_host_key, o.concurrency, o.timeout, o.attempts.max(1));
    let (known, pinned_only) = match trust {
        Trust::Local => (Given::over(known, targets), false),
        // A request's host keys are never its own to vouch for: the
        // caller's pins decide.
        Trust::Untrusted { pinned, .. } => (pinned.clone(), true),
    };
    let results: Vec<_> = stream::iter(targets.iter().cloned())
        .map(|t| {
            let known = known.clone();
            async move {
                if pinned_only {
                    for hop in [Some(&t), t.bastion.as_deref()].into_iter().flatten() {
                        let endpoint = format!("{}:{}", hop.address, hop.port);
                        if known.get(&endpoint).is_none() {
                            return Err(TransportError::Unpinned {
                                host: hop.name.clone(),
                                endpoint,
                            });
                        }
                    }
                }
                let mut last = None;
                // A host still booting refuses connections for a moment: retry those only.
                for attempt in 0..attempts {
                    match ssh::connect(&t, known.clone(), accept_new_key && !pinned_only, pinned_only, timeout).await {
                        Ok(s) => return Ok((t.name.clone(), Arc::new(s) as Arc<dyn Transport>)),
                        Err(e) if e.transient() => last = Some(e),
                        Err(e) => return Err(e),
                    }
                    if attempt + 1 < attempts {
                        tokio::time::sleep(Duration::from_millis(500 << attempt.min(5))).await;
                    }
                }
                Err(last.unwrap_or_else(|| TransportError::Connect {
                    host: t.name.clone(),
                    address: t.address.clone(),
                    why: "unknown".into(),
                }))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut ok = HashMap::new();
    let mut errs = Vec::new();
    for r in results {
        match r {
            Ok((n, t)) => {
                ok.insert(n, t);
            }
            Err(e) => errs.push(e),
        }
    }
    (ok, errs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ssh::MemoryKnownHosts;

    #[test]
    fn a_host_key_the_config_gives_is_checked_over_the_pin_first_contact_made() {
        let pinned = Arc::new(MemoryKnownHosts::default());
        pinned.put("10.0.0.1:22", "ssh-ed25519 AAAAfirst");
        pinned.put("10.0.0.2:22", "ssh-ed25519 AAAAsecond");
        let target = |address: &str, key: Option<&str>| Target {
            name: address.into(),
            address: address.into(),
            port: 22,
            user: "root".into(),
            credential: Credential::Agent,
            bastion: None,
            host_key: key.map(str::to_string),
        };
        let targets = [
            target("10.0.0.1", Some("ssh-ed25519 AAAAgiven")),
            target("10.0.0.2", None),
            target("10.0.0.3", Some("ssh-ed25519 AAAAnew")),
        ];
        let known = Given::over(pinned.clone(), &targets);
        assert_eq!(known.get("10.0.0.1:22").as_deref(), Some("ssh-ed25519 AAAAgiven"));
        assert_eq!(known.get("10.0.0.2:22").as_deref(), Some("ssh-ed25519 AAAAsecond"));
        assert_eq!(known.get("10.0.0.3:22").as_deref(), Some("ssh-ed25519 AAAAnew"));
        // Pins go to the store underneath.
        known.put("10.0.0.4:22", "ssh-ed25519 AAAAfourth");
        assert_eq!(pinned.get("10.0.0.4:22").as_deref(), Some("ssh-ed25519 AAAAfourth"));
    }
}
