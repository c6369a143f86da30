//! One opened cluster: what every operation (install, reset, facts, and
//! each later kind) needs before its first step, opened once and shared.
//! The config is held as a value (a worker hands over the job's text, never
//! a file); the bundle is optional (reset and facts work after it is gone)
//! and, when given, its lock's catalog is what the config is completed
//! against. The engine (the state store, the runtime, the hosts' SSH
//! targets) is made on the first job, so a dry run writes nothing. Hosts the
//! caller names unreachable are never connected to. This is the only place
//! that builds an engine context or runs an engine job.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kubexm_bom::catalog::Catalog;
use kubexm_bom::config::Cluster;
use kubexm_bom::record::{ClusterRecord, JobRef};
use kubexm_bundle::manifest::BundleManifest;

use super::EngineSettings;
use super::error::{OpError, op};
use crate::engine::inventory::{self, Connector};
use crate::engine::jobs::{self, Execution, FactsReport, Hosts, JobSpec};
use crate::engine::plan::Pipeline;
use crate::engine::run::Policy;
use crate::engine::ssh::Target;
use crate::engine::state::{Span, now_ms};
use crate::engine::store::Store;
use crate::engine::timeline::Timeline;

/// Where a cluster's config comes from.
#[derive(Debug, Clone)]
pub enum Config {
    /// A file the operator names.
    File(PathBuf),
    /// Config text (a job's), its errors naming `name`.
    Text { name: String, text: String },
}

impl Config {
    /// What errors call the config.
    pub fn name(&self) -> String {
        match self {
            Config::File(p) => p.display().to_string(),
            Config::Text { name, .. } => name.clone(),
        }
    }

    /// Validated and completed against `catalog`.
    fn load(&self, catalog: &Catalog) -> Result<Cluster, kubexm_bom::config::LoadError> {
        match self {
            Config::File(p) => kubexm_bom::config::load_file(p, catalog),
            Config::Text { name, text } => kubexm_bom::config::load_str(text, name, catalog),
        }
    }

    /// Validated for an operation that only reaches its hosts.
    pub(crate) fn load_hosts(&self) -> Result<Cluster, kubexm_bom::config::LoadError> {
        match self {
            Config::File(p) => kubexm_bom::config::load_file_hosts(p),
            Config::Text { name, text } => kubexm_bom::config::load_str_hosts(text, name),
        }
    }
}

/// What the machine running the operation brings: the CLI's flags, a
/// worker's options. Never part of a request.
#[derive(Debug, Clone)]
pub struct Settings {
    pub engine: EngineSettings,
    /// The installer's state root (unpacked bundles, PKI, kubeconfigs).
    pub root: PathBuf,
    /// The bundle's public key; `None`: installed without a signature check
    /// (`--allow-unsigned`, or a bundle `kubexm bundle add` checked).
    pub pubkey: Option<PathBuf>,
    /// A differential bundle's base file (`--base`), for the registry host.
    pub base: Option<PathBuf>,
    /// The address hosts reach this machine at, for the file server.
    pub advertise: Option<std::net::IpAddr>,
    pub serve_port: u16,
    /// Where the admin kubeconfig goes; `None`: `<root>/<cluster>.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// The kubexm-install binary the registry host runs as its registry
    /// service. `None`: this process's own (kubexm-install itself).
    pub installer: Option<PathBuf>,
}

impl Settings {
    /// Settings for an operation that needs only the engine's.
    pub fn engine_only(engine: EngineSettings) -> Settings {
        Settings {
            engine,
            root: crate::paths::ROOT.into(),
            pubkey: None,
            base: None,
            advertise: None,
            serve_port: crate::paths::SERVE_PORT,
            kubeconfig: None,
            installer: None,
        }
    }
}

/// A bundle opened with the session: its file, the `bundle.yaml` read
/// before anything is unpacked, and the catalog its lock carries.
#[derive(Debug)]
pub struct OpenBundle {
    pub path: PathBuf,
    pub manifest: BundleManifest,
    /// The content's id (`sha256:<hex>` of its `bundle.yaml`, or for a
    /// differential bundle of the full bundle's it stands for): the
    /// directory it unpacks to, what the record and the Cluster status name.
    pub digest: String,
    /// `sha256:<hex>` of the file's own `bundle.yaml`: what a job names and
    /// checks (the same as `digest` but for a differential bundle).
    pub file_digest: String,
    pub catalog: Catalog,
    /// `path` is the bundle's directory, unpacked (and verified) by an
    /// earlier install: there is no file to verify or upload.
    pub unpacked: bool,
}

/// The engine of a session, made on its first job.
struct Engine {
    targets: Vec<Target>,
    store: Arc<dyn Store>,
    stop: Arc<AtomicBool>,
    rt: tokio::runtime::Runtime,
}

/// A cluster opened for operations.
pub struct Session {
    cluster: Cluster,
    config: String,
    /// Where the config came from (its text is read again for positions).
    source: Option<Config>,
    bundle: Option<OpenBundle>,
    settings: Settings,
    /// The caller's store; `None`: the state database `settings` names.
    store: Option<Arc<dyn Store>>,
    connector: Option<Arc<dyn Connector>>,
    unreachable: BTreeSet<String>,
    engine: Mutex<Option<Arc<Engine>>>,
    /// What ran before the next job (verify, unpack, serve, ...), recorded
    /// with it as its preamble.
    preamble: Mutex<Vec<Span>>,
    /// The last job run, for its timeline.
    last_job: Mutex<Option<i64>>,
    /// The cluster's Lease, once a job that changes it ran (held until the
    /// session, and any session sharing it, ends).
    owned: Mutex<Option<Arc<super::owner::Owned>>>,
}

/// Job kinds that change nothing on the hosts: they run without the
/// cluster's Lease. Every other kind takes it.
const READ_ONLY: [&str; 4] = ["facts", "certs-check", "etcd-snapshot", "upgrade-check"];

/// The job kind that acts on when the Lease is lost: a restore brings the
/// Lease back as its snapshot had it.
const ACTS_ON: &str = "etcd-restore";

/// `config` checked against the catalog `bundle` carries (its first member,
/// bundle.yaml, read without unpacking anything): what an install, and a
/// job that will run one, checks first. The config's own errors come first
/// even without a readable bundle (only its versions need the catalog).
pub fn validate(config: &Config, bundle: &Path) -> anyhow::Result<(OpenBundle, Cluster)> {
    let head = match kubexm_bundle::verify::read_head(bundle) {
        Ok(h) => h,
        Err(e) => {
            config.load_hosts()?;
            return Err(crate::unpack::UnpackError::from(e).classified());
        }
    };
    let catalog = super::lock_catalog(&head.manifest, bundle)?;
    let cluster = config.load(&catalog)?;
    let opened = OpenBundle {
        path: bundle.to_path_buf(),
        manifest: head.manifest,
        digest: head.content_digest,
        file_digest: head.digest,
        catalog,
        unpacked: false,
    };
    Ok((opened, cluster))
}

/// The bundle `digest` (its content's id: `sha256:<hex>` of the full
/// `bundle.yaml` an earlier install wrote in its directory) as that install unpacked it under `root`, and `config` checked against its
/// catalog; `None` when it is not there (never unpacked, or not finished).
pub fn unpacked(config: &Config, root: &Path, digest: &str) -> anyhow::Result<Option<(OpenBundle, Cluster)>> {
    let Some(hex) = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    else {
        return Ok(None);
    };
    let dir = root.join("bundles").join(hex);
    let path = dir.join(kubexm_bundle::manifest::MANIFEST_NAME);
    if !dir.join(crate::unpack::COMPLETE).is_file() || !path.is_file() {
        return Ok(None);
    }
    let text = fs_err::read_to_string(&path)?;
    if kubexm_bundle::digest::sha256_hex(text.as_bytes()) != hex {
        return Err(op(
            OpError::Verify,
            anyhow::anyhow!(
                "{}: its digest is not its directory's name: the unpacked bundle was changed; pass --bundle FILE",
                path.display()
            ),
        ));
    }
    let manifest = BundleManifest::from_yaml(&text).map_err(|e| op(OpError::Verify, anyhow::anyhow!("{}: {e}", path.display())))?;
    let catalog = super::lock_catalog(&manifest, &dir)?;
    let cluster = config.load(&catalog)?;
    let opened = OpenBundle {
        path: dir,
        manifest,
        digest: digest.to_string(),
        file_digest: digest.to_string(),
        catalog,
        unpacked: true,
    };
    Ok(Some((opened, cluster)))
}

/// Refuses a host name (of `hosts`, named unreachable) that is not a host
/// of `cluster`, naming its hosts.
pub fn check_hosts(cluster: &Cluster, hosts: &[String]) -> anyhow::Result<()> {
    match hosts.iter().find(|h| !cluster.spec.hosts.iter().any(|x| &x.name == *h)) {
        None => Ok(()),
        Some(unknown) => Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "{unknown} is not a host of cluster {} (its hosts: {})",
                cluster.metadata.name,
                cluster.spec.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

impl Session {
    /// Opens the cluster of `config`: with a `bundle`, completed against the
    /// catalog its lock carries; without, checked for reaching its hosts
    /// only. `store`: the engine's store (`None`: the state database the
    /// settings name, opened on the first job).
    pub fn open(config: &Config, bundle: Option<&Path>, store: Option<Arc<dyn Store>>, settings: Settings) -> anyhow::Result<Session> {
        let started = now_ms();
        let (cluster, bundle) = match bundle {
            Some(path) => {
                let (bundle, cluster) = validate(config, path)?;
                (cluster, Some(bundle))
            }
            None => (config.load_hosts()?, None),
        };
        Ok(Session::opened(config, cluster, bundle, store, settings, started))
    }

    /// A session of `config`, completed as `cluster` against the catalog of
    /// `bundle`, opened (checked, read) since `started`.
    pub fn opened(
        config: &Config,
        cluster: Cluster,
        bundle: Option<OpenBundle>,
        store: Option<Arc<dyn Store>>,
        settings: Settings,
        started: i64,
    ) -> Session {
        let mut session = Session::of(cluster, config.name(), settings);
        if bundle.is_some() {
            session
                .preamble
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .push(Span::since("validate", started));
        }
        session.bundle = bundle;
        session.store = store;
        session.source = Some(config.clone());
        session
    }

    /// A session of a config already loaded (by an operation that reads
    /// its catalog from elsewhere: `packages`, from an unpacked bundle).
    pub fn of(cluster: Cluster, config: String, settings: Settings) -> Session {
        Session {
            cluster,
            config,
            source: None,
            bundle: None,
            settings,
            store: None,
            connector: None,
            unreachable: BTreeSet::new(),
            engine: Mutex::new(None),
            preamble: Mutex::new(Vec::new()),
            last_job: Mutex::new(None),
            owned: Mutex::new(None),
        }
    }

    /// Runs `f` as a stretch of the next job's preamble named `name`.
    pub fn span<T>(&self, name: &str, f: impl FnOnce() -> T) -> T {
        let started = now_ms();
        let out = f();
        self.preamble
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Span::since(name, started));
        out
    }

    /// The timeline of `job` in the session's store; `None` when it cannot
    /// be read (the run's outcome does not depend on it).
    pub fn timeline(&self, job: i64) -> Option<Timeline> {
        let e = self.engine().ok()?;
        e.rt.block_on(Timeline::load(e.store.as_ref(), Some(job))).ok().flatten()
    }

    /// The timeline of the last job this session ran, if it ran one.
    pub fn last_timeline(&self) -> Option<Timeline> {
        let job = (*self.last_job.lock().unwrap_or_else(|e| e.into_inner()))?;
        self.timeline(job)
    }

    /// The lines a person reads at the end of a run of `job` (empty when
    /// its timeline cannot be read).
    pub fn timing(&self, job: i64) -> String {
        self.timeline(job).map(|t| t.summary()).unwrap_or_default()
    }

    /// Connects through `connector` instead of SSH (a test's fake).
    pub fn with_connector(mut self, connector: Arc<dyn Connector>) -> Session {
        self.connector = Some(connector);
        self
    }

    /// Hosts the caller knows to be unreachable: never contacted, and left
    /// out of every job. A name that is not a host of the config is refused.
    pub fn unreachable(&mut self, hosts: &[String]) -> anyhow::Result<()> {
        check_hosts(&self.cluster, hosts)?;
        self.unreachable.extend(hosts.iter().cloned());
        *self.engine.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// The hosts named unreachable.
    pub fn unreachable_hosts(&self) -> &BTreeSet<String> {
        &self.unreachable
    }

    /// The cluster's completed config.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// What errors call the config (its file, or the job's name for it).
    pub fn config_name(&self) -> &str {
        &self.config
    }

    /// The bundle opened with the session.
    pub fn bundle(&self) -> Option<&OpenBundle> {
        self.bundle.as_ref()
    }

    /// The machine's settings the session was opened with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The hosts to work on: every host of the config not named unreachable.
    pub fn hosts(&self) -> Vec<String> {
        self.cluster
            .spec
            .hosts
            .iter()
            .map(|h| h.name.clone())
            .filter(|h| !self.unreachable.contains(h))
            .collect()
    }

    /// The engine, made on first use.
    fn engine(&self) -> anyhow::Result<Arc<Engine>> {
        let mut slot = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let e = &self.settings.engine;
        let (mut targets, secrets) = inventory::targets(&self.cluster, &e.trust).map_err(|e| op(OpError::Config, e))?;
        targets.retain(|t| !self.unreachable.contains(&t.name));
        let store = match &self.store {
            Some(s) => s.clone(),
            None => Arc::new(crate::engine::state::State::open(&e.state, secrets)?) as Arc<dyn Store>,
        };
        let stop = e.stop.clone().unwrap_or_default();
        let rt = tokio::runtime::Runtime::new()?;
        let stopper = stop.clone();
        rt.spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stopper.store(true, Ordering::Relaxed);
            }
        });
        let engine = Arc::new(Engine { targets, store, stop, rt });
        *slot = Some(engine.clone());
        Ok(engine)
    }

    fn connector(&self) -> Arc<dyn Connector> {
        match &self.connector {
            Some(c) => c.clone(),
            None => Arc::new(inventory::Ssh(self.settings.engine.connect())),
        }
    }

    /// Runs `f` on the session's runtime (a file server for its jobs).
    pub fn spawn<F>(&self, f: F) -> anyhow::Result<tokio::task::JoinHandle<F::Output>>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Ok(self.engine()?.rt.spawn(f))
    }

    /// Gathers the facts of every reachable host as one job.
    pub fn facts(&self) -> anyhow::Result<FactsReport> {
        let e = self.engine()?;
        let hosts = Hosts {
            cluster: &self.cluster.metadata.name,
            targets: &e.targets,
        };
        let connector = self.connector();
        let report = e.rt.block_on(jobs::facts(
            hosts,
            e.store.clone(),
            connector.as_ref(),
            self.settings.engine.concurrency,
            self.settings.engine.events.clone(),
            e.stop.clone(),
        ))?;
        *self.last_job.lock().unwrap_or_else(|e| e.into_inner()) = Some(report.job);
        Ok(report)
    }

    /// The config's text indexed by YAML path, for errors that name a line
    /// (`None` when it cannot be read again).
    pub fn located(&self) -> Option<kubexm_bom::yaml::Located> {
        kubexm_bom::yaml::parse(&self.config_text()?).ok()
    }

    /// The config's text, as the session was opened on it (read again from
    /// its file).
    pub fn config_text(&self) -> Option<String> {
        match self.source.as_ref()? {
            Config::File(p) => fs_err::read_to_string(p).ok(),
            Config::Text { text, .. } => Some(text.clone()),
        }
    }

    /// The cluster's latest job of `kind`, whatever its status (none
    /// without a state database).
    pub fn last_job(&self, kind: &str) -> anyhow::Result<Option<crate::engine::state::JobRecord>> {
        if self.store.is_none() && !self.settings.engine.state.exists() {
            return Ok(None);
        }
        let e = self.engine()?;
        Ok(e.rt.block_on(e.store.last_job(&self.cluster.metadata.name, kind))?)
    }

    /// The cluster's latest record (of a succeeded job, when `succeeded`).
    /// Without a store of the caller's and without a state database, none:
    /// reading creates nothing.
    pub fn last_record(&self, succeeded: bool) -> anyhow::Result<Option<ClusterRecord>> {
        if self.store.is_none() && !self.settings.engine.state.exists() {
            return Ok(None);
        }
        let e = self.engine()?;
        let name = &self.cluster.metadata.name;
        let Some((job, body)) = e.rt.block_on(e.store.last_record(name, succeeded))? else {
            return Ok(None);
        };
        super::status::parse_record(name, job, &body).map(Some)
    }

    /// Every step a job of operation `kind` would skip if it started now
    /// (none without a state database: reading creates nothing).
    pub fn done_steps(&self, kind: &str) -> anyhow::Result<std::collections::HashSet<String>> {
        if self.store.is_none() && !self.settings.engine.state.exists() {
            return Ok(Default::default());
        }
        let e = self.engine()?;
        Ok(e.rt.block_on(e.store.done_steps(&self.cluster.metadata.name, kind))?)
    }

    /// Keeps the cluster record of `job` (which this session ran): the
    /// completed config, each host's roles and arch (`arches`, as
    /// gathered), the lock's versions and digests (`bom`), the bundle's
    /// digest and the job's result. Written for a failed job too: `apply`
    /// reads the last successful record plus the steps a failed one did.
    pub fn keep_record(&self, job: i64, bom: Option<&kubexm_bom::Bom>, arches: &BTreeMap<String, String>) -> anyhow::Result<()> {
        let prev = self.last_record(false).ok().flatten();
        let digest = self.bundle.as_ref().map(|b| b.digest.as_str());
        self.put_record(job, &[], |job_ref| {
            let record = ClusterRecord::new(&self.cluster, job_ref, bom, digest, arches);
            match &prev {
                Some(p) => record.keeping_removed(p),
                None => record,
            }
        })
    }

    /// Keeps the record `make` builds from `job`'s result as the cluster's
    /// record after `job`, and notes the hosts `removed` took out of the
    /// cluster (earlier steps on them no longer count as done).
    pub fn put_record(&self, job: i64, removed: &[String], make: impl FnOnce(JobRef) -> ClusterRecord) -> anyhow::Result<()> {
        let e = self.engine()?;
        let name = &self.cluster.metadata.name;
        let kept = e.rt.block_on(async {
            let j = e.store.job(Some(job)).await?.ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
            let job_ref = JobRef {
                id: j.id,
                kind: j.kind,
                status: j.status.clone(),
                finished: j.finished.unwrap_or_else(now_ms),
            };
            let body = serde_json::to_string(&make(job_ref))?;
            e.store.put_removed(job, name, removed).await?;
            e.store.put_record(job, name, &j.status, &body).await?;
            anyhow::Ok(())
        });
        kept.map_err(|err| {
            op(
                OpError::Io,
                anyhow::anyhow!(
                    "job {job} ran, but the cluster record could not be kept in the state database ({err}); \
                     check the disk and the file, then run it again (done steps are skipped)"
                ),
            )
        })
    }

    /// After a failed `job` that changed nothing the record says: keeps
    /// `record` as it was, with the job's result beside it (a failure to
    /// keep it is only warned about: the job's own errors matter more).
    pub fn keep_unchanged(&self, job: i64, record: &ClusterRecord) {
        if let Err(e) = self.put_record(job, &[], |job| ClusterRecord { job, ..record.clone() }) {
            tracing::warn!("{e:#}");
        }
    }

    /// Forgets the cluster's records (`delete cluster`): its jobs stay.
    pub fn forget(&self) -> anyhow::Result<()> {
        let e = self.engine()?;
        Ok(e.rt.block_on(e.store.forget_cluster(&self.cluster.metadata.name))?)
    }

    /// Works on `cluster` from now on (an operation that completes the
    /// config from the cluster's record, or works on some hosts only): the
    /// hosts named unreachable that it does not list are forgotten.
    pub fn use_cluster(&mut self, cluster: Cluster) {
        self.unreachable.retain(|u| cluster.spec.hosts.iter().any(|h| &h.name == u));
        self.cluster = cluster;
        *self.engine.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Takes the cluster's Lease for the rest of the session, once
    /// ([`super::owner`]): every job that changes the hosts does; an
    /// operation calls it itself to be refused before its preamble.
    pub fn own(&self) -> anyhow::Result<()> {
        self.own_for("").map(drop)
    }

    /// [`Session::own`] for a job of `kind`.
    fn own_for(&self, kind: &str) -> anyhow::Result<Arc<super::owner::Owned>> {
        let e = self.engine()?;
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = owned.as_ref() {
            return Ok(o.clone());
        }
        let kubeconfig = super::install::kubeconfig_path(&self.settings, &self.cluster);
        let taken = Arc::new(super::owner::take(
            &kubeconfig,
            super::owner::Taking {
                name: &self.cluster.metadata.name,
                how: &self.settings.engine.owner,
                installed: self.last_record(true).unwrap_or(None).is_some(),
                stop: e.stop.clone(),
                stop_on_loss: kind != ACTS_ON,
            },
        )?);
        *owned = Some(taken.clone());
        Ok(taken)
    }

    /// This session changes nothing (a server-side dry run): its jobs run
    /// without the Lease.
    pub fn without_lease(&self) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.get_or_insert_with(Default::default);
    }

    /// This session acts under `other`'s Lease (an upgrade's earlier hops
    /// under the upgrade's), rather than taking and handing back its own.
    pub fn share_lease(&self, other: &Session) {
        let theirs = other.owned.lock().unwrap_or_else(|e| e.into_inner()).clone();
        *self.owned.lock().unwrap_or_else(|e| e.into_inner()) = theirs;
    }

    /// Runs the pipeline built for the hosts that answered as one job of
    /// `kind` under `policy`.
    pub fn execute(
        &self,
        kind: &str,
        policy: Policy,
        pipeline: impl FnOnce(Vec<String>) -> anyhow::Result<Pipeline>,
    ) -> anyhow::Result<Execution> {
        let e = self.engine()?;
        let owned = if READ_ONLY.contains(&kind) {
            None
        } else {
            Some(self.own_for(kind)?)
        };
        let lost = || {
            owned.as_ref().and_then(|o| o.lost()).map_or(Ok(()), |why| {
                Err(op(
                    OpError::Host,
                    anyhow::anyhow!("{why}: no new step was started; run this again once it is handed back"),
                ))
            })
        };
        lost()?;
        let hosts = Hosts {
            cluster: &self.cluster.metadata.name,
            targets: &e.targets,
        };
        let connector = self.connector();
        let eo = self.settings.engine.options(policy);
        let spec = JobSpec {
            kind,
            preamble: std::mem::take(&mut *self.preamble.lock().unwrap_or_else(|e| e.into_inner())),
        };
        let ex = e.rt.block_on(jobs::execute(
            hosts,
            e.store.clone(),
            spec,
            connector.as_ref(),
            &eo,
            e.stop.clone(),
            pipeline,
        ))?;
        *self.last_job.lock().unwrap_or_else(|e| e.into_inner()) = Some(ex.job);
        lost()?;
        Ok(ex)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::engine::fake::Connecting as Recording;

    const CONFIG: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: s\nspec:\n  hosts:\n\
                          \x20 - {name: a, address: 10.0.0.1, auth: {agent: true}}\n\
                          \x20 - {name: b, address: 10.0.0.2, auth: {agent: true}}\n\
                          \x20 - {name: c, address: 10.0.0.3, auth: {agent: true}}\n\
                          \x20 roleGroups: {control-plane: [a], etcd: [a], worker: [b, c]}\n\
                          \x20 controlPlaneEndpoint: {mode: local-proxy}\n";

    /// Issue 29: a job's cluster record is kept through the store and read
    /// back by `status --cluster`: each host's roles and arch, the job and
    /// its result; a cluster without one is refused, naming those with one.
    #[test]
    fn a_job_keeps_the_cluster_record_status_reads() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let state = dir.path().join("state.db");
        let config = dir.path().join("s.yaml");
        std::fs::write(&config, CONFIG)?;
        let mut settings = super::Settings::engine_only(engine(&state));
        settings.root = dir.path().join("root");
        let session =
            super::Session::open(&super::Config::File(config), None, None, settings)?.with_connector(Arc::new(Recording::default()));
        let step = crate::engine::jobs::one_task("probe", vec![], vec![]);
        let ex = session.execute("install", crate::engine::run::Policy::FailFast, |_| Ok(step))?;
        let arches = [("a".to_string(), "arm64".to_string())].into_iter().collect();
        session.keep_record(ex.job, None, &arches)?;
        let r = crate::ops::status::record(&state, "s")?;
        assert_eq!(
            (r.job.id, r.job.kind.as_str(), r.job.status.as_str()),
            (ex.job, "install", "succeeded")
        );
        let nodes: Vec<(&str, Option<&str>, String)> = r
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.arch.as_deref(), n.roles.join(",")))
            .collect();
        assert_eq!(
            nodes,
            [
                ("a", Some("arm64"), "etcd,control-plane".to_string()),
                ("b", None, "worker,local-proxy".to_string()),
                ("c", None, "worker,local-proxy".to_string())
            ]
        );
        assert_eq!(r.endpoint_mode, "local-proxy");
        assert_eq!(&r.config, session.cluster(), "the completed config is kept whole");
        let text = r.to_string();
        assert!(
            text.contains("cluster s: last job") && text.contains("(install, succeeded)"),
            "{text}"
        );
        let Err(e) = crate::ops::status::record(&state, "other") else {
            anyhow::bail!("a cluster without a record was shown");
        };
        let msg = format!("{e:#}");
        assert!(
            msg.contains("no record of cluster other") && msg.contains("clusters with a record: s"),
            "{msg}"
        );
        Ok(())
    }

    fn engine(state: &std::path::Path) -> super::EngineSettings {
        super::EngineSettings {
            state: state.to_path_buf(),
            accept_new_host_key: false,
            concurrency: 4,
            events: None,
            stop: None,
            trust: Default::default(),
            connect_timeout: super::super::CONNECT_TIMEOUT,
            connect_attempts: 1,
            owner: Default::default(),
        }
    }

    /// Issue 26: an operation on a cluster with one host named unreachable
    /// never opens a connection to it, and runs its steps on the others.
    #[test]
    fn a_host_named_unreachable_is_never_contacted() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let engine = engine(&dir.path().join("state.db"));
        let config = dir.path().join("s.yaml");
        std::fs::write(&config, CONFIG)?;
        let settings = super::Settings {
            engine,
            root: dir.path().join("root"),
            pubkey: None,
            base: None,
            advertise: None,
            serve_port: 0,
            kubeconfig: None,
            installer: None,
        };
        let recording = Arc::new(Recording::default());
        let mut session = super::Session::open(&super::Config::File(config), None, None, settings)?.with_connector(recording.clone());
        assert!(session.unreachable(&["z".into()]).is_err(), "a host not in the config was accepted");
        session.unreachable(&["c".into()])?;
        let facts = session.facts()?;
        let step = crate::engine::jobs::one_task("probe", vec![], vec![]);
        let ex = session.execute("probe", crate::engine::run::Policy::FailFast, |hosts| {
            assert_eq!(hosts, ["a", "b"], "the pipeline was built for an unreachable host");
            Ok(step)
        })?;
        assert!(ex.ok(), "{:?}", ex.errors());
        let asked = recording.asked();
        assert_eq!(asked, ["a", "b", "a", "b"], "connections asked for");
        assert!(recording.log.calls().iter().all(|(h, _)| h != "c"), "a command ran on c");
        assert!(facts.errors.iter().all(|e| !e.starts_with("c:")), "{:?}", facts.errors);
        for host in ["a", "b"] {
            assert!(recording.log.calls().iter().any(|(h, _)| h == host), "nothing ran on {host}");
        }
        Ok(())
    }
}
