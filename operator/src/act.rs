//! Running what the controller decided: a Cluster object that adds hosts
//! (or moves the registry) is applied to its hosts by the same operation
//! as `kubexm-install apply` ([`kubexm_installer::ops::apply`]), on a
//! session opened on the object's spec, with the bundle the cluster's
//! record names as an earlier install unpacked it under `root`; hosts it
//! no longer lists are taken out as `kubexm-install remove node` does
//! ([`kubexm_installer::ops::remove`]) first. The
//! controller logs in with the Secret [`kubexm_crd::CREDENTIAL`] and checks
//! each host's key against the pins the install made or the spec's
//! `hostKey` (a host added through the object needs one: no trust on first
//! use). The leader holds the Lease the whole time, so the job takes
//! nothing more ([`Ownership::Leader`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use kubexm_bom::config::Cluster;
use kubexm_crd::Operation;
use kubexm_installer::engine::ssh::{Credential, KnownHosts};
use kubexm_installer::engine::state::State;
use kubexm_installer::engine::trust::{Credentials, Trust};
use kubexm_installer::ops;
use kubexm_installer::ops::owner::Ownership;
use kubexm_installer::ops::session::{Config, Settings};

/// Where the controller runs what it decides: the installer's state root
/// and database of the cluster, and where its hosts fetch files from.
#[derive(Debug, Clone)]
pub struct ActOptions {
    /// The installer's state root (the unpacked bundles, the PKI).
    pub root: PathBuf,
    /// The installer's state database (steps done, pinned host keys).
    pub state: PathBuf,
    /// The address the hosts reach this machine at, for a file server of
    /// the controller's own; `None`: the hosts fetch files from the
    /// registry host's `kubexm-registry` (as `kubexm-install apply
    /// --files-from-registry`).
    pub advertise: Option<IpAddr>,
    /// The own file server's port.
    pub serve_port: u16,
    /// Hosts worked on at once.
    pub concurrency: usize,
    /// The kubexm-install the registry host runs as its registry service.
    pub installer: Option<PathBuf>,
}

/// The keys of the Secret [`kubexm_crd::CREDENTIAL`]: a private key (as
/// `kubectl create secret generic --from-file` or the `kubernetes.io/ssh-auth`
/// type names it) or a password.
const KEY: &str = "ssh-privatekey";
const PASSWORD: &str = "password";

/// The controller's login method, read from its Secret.
#[derive(Clone)]
enum Method {
    Key(String),
    Password(String),
}

/// The Secret [`kubexm_crd::CREDENTIAL`] in `namespace`, read for one run;
/// why it cannot be used otherwise (the message says how to make it).
pub async fn login(client: &Client, namespace: &str) -> Result<Arc<dyn Credentials>, String> {
    let name = kubexm_crd::CREDENTIAL;
    let how = format!(
        "create it with `kubectl -n {namespace} create secret generic {name} --from-file={KEY}=KEY_FILE` \
         (or --from-literal={PASSWORD}=...)"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match secrets.get_opt(name).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(format!(
                "the Secret {namespace}/{name} the controller logs in to the hosts with is missing: {how}"
            ));
        }
        Err(e) => {
            return Err(format!(
                "the Secret {namespace}/{name} cannot be read ({e}): the controller's account needs get on secrets/{name} \
                 in {namespace}"
            ));
        }
    };
    let data = secret.data.unwrap_or_default();
    let text = |k: &str| data.get(k).map(|v| String::from_utf8_lossy(&v.0).into_owned());
    let login = match (text(KEY), text(PASSWORD)) {
        (Some(k), _) if !k.trim().is_empty() => Method::Key(k),
        (_, Some(p)) if !p.is_empty() => Method::Password(p.trim_end_matches(['\r', '\n']).to_string()),
        _ => return Err(format!("the Secret {namespace}/{name} has neither {KEY} nor {PASSWORD}: {how}")),
    };
    Ok(Arc::new(SecretLogin(login)))
}

/// The controller's one credential, offered to the hosts of the spec only
/// (the engine asks for no other).
struct SecretLogin(Method);

impl Credentials for SecretLogin {
    fn resolve(&self, name: &str, _host: &str, _address: &str) -> Result<Credential, String> {
        if name != kubexm_crd::CREDENTIAL {
            return Err(format!(
                "the controller logs in with the Secret {} only, not {name:?}: drop the host's auth from the spec",
                kubexm_crd::CREDENTIAL
            ));
        }
        Ok(match &self.0 {
            Method::Key(pem) => Credential::KeyData {
                pem: pem.clone(),
                passphrase: None,
            },
            Method::Password(p) => Credential::Password(p.clone()),
        })
    }
}

/// The host keys a run checks: each pin the installer made (first contact
/// at the install), else the spec's `hostKey`. Never pins one.
struct Pins(BTreeMap<String, String>);

impl KnownHosts for Pins {
    fn get(&self, endpoint: &str) -> Option<String> {
        self.0.get(endpoint).cloned()
    }
    fn put(&self, _endpoint: &str, _key: &str) {}
}

/// `address:port` of a host.
fn endpoint(h: &kubexm_bom::config::model::Host) -> String {
    format!("{}:{}", h.address, h.port.unwrap_or(22))
}

/// The host keys a run checks, by `address:port`.
#[derive(Debug, Default)]
pub struct Pinned {
    /// Every host's.
    pub all: BTreeMap<String, String>,
    /// The hosts added's, from the spec: kept in the state database once
    /// the run succeeded ([`remember`]), as first contact would.
    pub added: BTreeMap<String, String>,
}

/// The installer's state database of the cluster; never made anew (a
/// wrong `--state` would otherwise pin nothing).
fn state(act: &ActOptions) -> Result<State, String> {
    let path = &act.state;
    if !path.is_file() {
        return Err(format!(
            "the state database {} is not there: --state must be the cluster's installer state (its steps and pinned host keys)",
            path.display()
        ));
    }
    State::open(path, Vec::new()).map_err(|e| format!("the state database {}: {e}", path.display()))
}

/// The pins for every host of `old` and `new` (a removal reaches the
/// first, the apply the second): a host `old` has is checked against the
/// key pinned when it was first reached (the state database's); a host
/// `new` adds against its spec's `hostKey` only (never a key pinned
/// before: a host added again may be a new machine). A host without one
/// is named, `spec.hosts[i]...: why`.
pub fn pins(act: &ActOptions, old: &Cluster, new: &Cluster) -> Result<Pinned, Vec<String>> {
    let state = state(act).map_err(|e| vec![e])?;
    let had: BTreeSet<&str> = old.spec.hosts.iter().map(|h| h.name.as_str()).collect();
    let mut out = Pinned::default();
    let mut missing = Vec::new();
    for h in &old.spec.hosts {
        let e = endpoint(h);
        match state.get(&e) {
            Some(k) => {
                out.all.insert(e, k);
            }
            None => {
                let i = new.spec.hosts.iter().position(|n| n.name == h.name);
                let at = i.map_or_else(|| format!("host {}", h.name), |i| format!("spec.hosts[{i}]: host {}", h.name));
                missing.push(format!(
                    "{at} has no host key pinned in {} (it was never reached from there): run kubexm-install facts \
                     -f cluster.yaml --state {} where the cluster was installed to pin it",
                    act.state.display(),
                    act.state.display()
                ));
            }
        }
    }
    for (i, h) in new.spec.hosts.iter().enumerate().filter(|(_, h)| !had.contains(h.name.as_str())) {
        match h.host_key.as_deref().and_then(|k| kubexm_bom::net::host_key(k).ok()) {
            Some(k) => {
                out.all.insert(endpoint(h), k.clone());
                out.added.insert(endpoint(h), k);
            }
            None => missing.push(format!(
                "spec.hosts[{i}].hostKey: host {} is added through the Cluster object and its key is not given: give its \
                 hostKey (ssh-ed25519 BASE64, the first two fields of its /etc/ssh/ssh_host_ed25519_key.pub); the \
                 controller never trusts a host key on first use",
                h.name
            )),
        }
    }
    if missing.is_empty() { Ok(out) } else { Err(missing) }
}

/// Keeps the added hosts' keys in the state database, as first contact
/// pins them: a later run checks them there, not in the spec.
pub fn remember(act: &ActOptions, added: &BTreeMap<String, String>) -> Result<(), String> {
    let state = state(act)?;
    for (endpoint, key) in added {
        state.put(endpoint, key);
    }
    Ok(())
}

/// The hosts `new` adds to `old`, by name.
pub fn added(old: &Cluster, new: &Cluster) -> Vec<String> {
    let had: BTreeSet<&str> = old.spec.hosts.iter().map(|h| h.name.as_str()).collect();
    new.spec
        .hosts
        .iter()
        .filter(|h| !had.contains(h.name.as_str()))
        .map(|h| h.name.clone())
        .collect()
}

/// The hosts `old` has that `new` does not, by name.
pub fn removed(old: &Cluster, new: &Cluster) -> Vec<String> {
    added(new, old)
}

/// How a run reaches the hosts and as whom: the controller's login, the
/// pins, the Lease's holder `identity`, and `stop` (set when it stops).
pub struct Login {
    pub credentials: Arc<dyn Credentials>,
    pub pins: BTreeMap<String, String>,
    pub identity: String,
    pub stop: Arc<AtomicBool>,
}

/// A config (a Cluster object as config text) of cluster `name`.
fn config(name: &str, document: String) -> Config {
    Config::Text {
        name: format!("clusters.kubexm.io/{name}"),
        text: document,
    }
}

/// The settings of a run as `login`.
fn settings(act: &ActOptions, login: Login) -> Settings {
    let engine = ops::EngineSettings {
        state: act.state.clone(),
        accept_new_host_key: false,
        concurrency: act.concurrency,
        events: None,
        stop: Some(login.stop),
        trust: Trust::Untrusted {
            credentials: login.credentials,
            pinned: Arc::new(Pins(login.pins)),
        },
        connect_timeout: ops::CONNECT_TIMEOUT,
        connect_attempts: ops::CONNECT_ATTEMPTS,
        owner: Ownership::Leader { identity: login.identity },
    };
    Settings {
        engine,
        root: act.root.clone(),
        pubkey: None,
        base: None,
        advertise: act.advertise,
        serve_port: act.serve_port,
        kubeconfig: None,
        installer: act.installer.clone(),
    }
}

/// What a run did: its report or why it failed, and its job as the
/// status' `lastOperation` names it (none when no job started).
pub struct Ran {
    pub result: Result<String, String>,
    pub operation: Option<Operation>,
}

impl Ran {
    /// A run that failed before its job started.
    fn failed(e: impl std::fmt::Display) -> Ran {
        Ran {
            result: Err(format!("{e:#}")),
            operation: None,
        }
    }
}

/// The last job `session` ran, as `lastOperation` names it.
fn operation(session: &ops::session::Session) -> Option<Operation> {
    let t = session.last_timeline()?;
    Some(Operation {
        job: t.job,
        kind: t.kind.clone(),
        result: t.status.clone(),
        timeline: Some(format!(
            "{} in all; critical path by phase: {}",
            kubexm_installer::engine::timeline::secs(t.total_ms),
            t.critical_by_phase()
        )),
    })
}

/// Applies `document` (the Cluster object as a config, logging in with
/// the controller's credential) to cluster `name`'s hosts as `login`
/// says: blocking, for minutes. The job's steps are in the state
/// database; a new generation runs it again, skipping the steps done.
pub fn apply(act: &ActOptions, name: &str, document: String, login: Login) -> Ran {
    let session = match ops::apply::recorded_session(&config(name, document), settings(act, login)) {
        Ok(s) => s,
        Err(e) => return Ran::failed(e),
    };
    let options = ops::apply::ApplyOptions {
        files_from_registry: act.advertise.is_none(),
        ..Default::default()
    };
    let result = ops::apply::apply(&session, &options)
        .map(|r| r.to_string())
        .map_err(|e| format!("{e:#}"));
    Ran {
        result,
        operation: operation(&session),
    }
}

/// Takes `hosts` out of cluster `name` as `kubexm-install remove node`
/// does (drained, Nodes deleted, hosts reset), `document` being the spec
/// last applied (which still lists them): blocking.
pub fn remove(act: &ActOptions, name: &str, document: String, hosts: Vec<String>, login: Login) -> Ran {
    let mut session = match ops::session::Session::open(&config(name, document), None, None, settings(act, login)) {
        Ok(s) => s,
        Err(e) => return Ran::failed(e),
    };
    // A host an earlier run took out (its apply then failed) is not in the
    // record any more: nothing to remove.
    let recorded: BTreeSet<String> = match session.last_record(true) {
        Ok(Some(r)) => r.nodes.into_iter().map(|n| n.name).collect(),
        Ok(None) => BTreeSet::new(),
        Err(e) => return Ran::failed(e),
    };
    let hosts: Vec<String> = hosts.into_iter().filter(|h| recorded.contains(h)).collect();
    if hosts.is_empty() {
        return Ran {
            result: Ok(String::new()),
            operation: None,
        };
    }
    let o = ops::remove::RemoveOptions {
        hosts,
        unreachable: Vec::new(),
        drain_timeout: ops::remove::DRAIN_TIMEOUT,
        force_drain: false,
        dry_run: false,
    };
    let result = match ops::remove::remove(&mut session, &o) {
        Ok(ops::remove::RemoveReport::Removed(r)) => Ok(r.to_string()),
        Ok(ops::remove::RemoveReport::Plan(p)) => Ok(p),
        Err(e) => Err(format!("{e:#}")),
    };
    Ran {
        result,
        operation: operation(&session),
    }
}
