//! `kubexm-install --bundle -f cluster.yaml`: verify and unpack the bundle,
//! serve it, gather facts, run preflight and the install pipeline as one
//! engine job. `dry_run` plans from the verified bundle in memory and
//! writes nothing.

use std::path::PathBuf;

use crate::ops::error::{OpError, op};

use super::session::{OpenBundle, Session};
use crate::context::Context;
use crate::engine::run;
use crate::engine::state::Outcome;
use crate::pipelines::Phase;
use crate::pipelines::install as pipeline;
use crate::{serve, unpack};

/// What an install is asked to do; where it runs (root, keys, the file
/// server's address) comes from the session's settings.
#[derive(Debug, Clone, Default)]
pub struct InstallOptions {
    /// Empty: every phase.
    pub phases: Vec<Phase>,
    pub dry_run: bool,
    /// Only the cni and addons phases: their manifests checked by the API
    /// server (`kubectl apply --dry-run=server`), CRDs and Namespaces created.
    pub server_dry_run: bool,
    /// The bundle the job asked for (`sha256:<hex>` of its signed
    /// `bundle.yaml`): any other, even one signed, is refused once read.
    pub expect_digest: Option<String>,
    /// Run as an `apply` job (`apply` checked the change against the
    /// cluster's record first): the install's steps, done ones skipped.
    pub apply: bool,
    /// In an apply, etcd's members as recorded ([`Context::etcd_before`]).
    pub etcd_before: Option<Vec<String>>,
    /// Run one hop of an upgrade (an `upgrade` job) instead of the
    /// install's pipeline.
    pub upgrade: Option<crate::pipelines::upgrade::HopRun>,
    /// Hosts fetch the bundle's files from the registry host's
    /// `kubexm-registry` (an installed cluster's, serving this bundle)
    /// instead of a file server on this machine, which then serves nothing
    /// and needs no address the hosts reach.
    pub files_from_registry: bool,
}

/// etcd's members already running: an apply's (from the record it
/// checked), or, for an install run again on an installed cluster, the
/// record's (members the config adds join them, as in an apply). `None`: a
/// new cluster, or one reset since.
fn etcd_before(session: &Session, args: &InstallOptions) -> anyhow::Result<Option<Vec<String>>> {
    if args.etcd_before.is_some() {
        return Ok(args.etcd_before.clone());
    }
    Ok(installed(session)?.map(|r| r.config.spec.role_groups.etcd))
}

/// The record of the cluster as installed: the last successful job's,
/// unless a reset (even a failed one) came since.
fn installed(session: &Session) -> anyhow::Result<Option<kubexm_bom::record::ClusterRecord>> {
    if session.last_record(false)?.is_some_and(|r| r.job.took_down()) {
        return Ok(None);
    }
    Ok(session.last_record(true)?.filter(|r| !r.job.took_down()))
}

/// What `install` did.
#[derive(Debug)]
pub enum InstallReport {
    /// `dry_run`: the plan, per phase and host.
    Plan(String),
    /// What was installed, and what the user has now.
    Installed(Installed),
}

/// A successful install.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Installed {
    pub cluster: String,
    pub job: i64,
    pub phases: Vec<Phase>,
    pub hosts: usize,
    pub applied: usize,
    pub skipped: usize,
    /// What the user has now, one line each (`control plane: ...`).
    pub have: Vec<String>,
    /// Where the time went: the job's length, its critical path per phase
    /// and its longest steps ([`crate::engine::timeline::Timeline::summary`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timing: String,
}

impl std::fmt::Display for InstallReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstallReport::Plan(plan) => write!(f, "{plan}"),
            InstallReport::Installed(i) => write!(f, "{i}"),
        }
    }
}

impl std::fmt::Display for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "installed phases {} on {} hosts (job {}): {} steps applied, {} already in place",
            crate::pipelines::names(&self.phases, ", "),
            self.hosts,
            self.job,
            self.applied,
            self.skipped
        )?;
        writeln!(f, "cluster {}:", self.cluster)?;
        for line in &self.have {
            writeln!(f, "  {line}")?;
        }
        write!(f, "{}", self.timing)
    }
}

/// cluster.yaml's spec as written (before defaults), for the Cluster
/// object; `None` when the session holds no config text.
fn written(session: &Session) -> Option<kubexm_bom::config::model::Spec> {
    let text = session.config_text()?;
    serde_saphyr::from_str::<kubexm_bom::config::Cluster>(&text).ok().map(|c| c.spec)
}

/// The operation an install run is: an upgrade's hop, an apply or an install.
fn operation(args: &InstallOptions) -> &'static str {
    match (&args.upgrade, args.apply) {
        (Some(_), _) => "upgrade",
        (None, true) => "apply",
        (None, false) => "install",
    }
}

/// The file server and registry for the install's duration: the bundle
/// unpacked here, TLS from the cluster's registry CA for the address it
/// listens on.
fn serve_options(
    bundle_dir: &std::path::Path,
    listen: std::net::SocketAddr,
    pki_dir: &std::path::Path,
    topo: &kubexm_bom::topology::Topology,
) -> serve::ServeOptions {
    serve::ServeOptions {
        bundle_dir: bundle_dir.to_path_buf(),
        older: vec![],
        listen,
        tls: serve::Tls::Issued {
            pki_dir: pki_dir.join("registry"),
            names: vec![listen.ip().to_string()],
        },
        parts: serve::Parts {
            registry: true,
            files: true,
        },
        limits: serve::ConnectionLimits::for_nodes(topo),
        client_ca: None,
    }
}

/// Installs the session's cluster from its bundle.
pub fn install(session: &Session, args: &InstallOptions) -> anyhow::Result<InstallReport> {
    let Some(bundle) = session.bundle() else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("pass --bundle k.tar.zst (built by kubexm-bundle)"),
        ));
    };
    let cluster = session.cluster();
    let settings = session.settings();
    let phases = phases_of(args, session.config_name(), cluster)?;
    let topo = kubexm_bom::topology::Topology::of(cluster).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
    let (manifest, bundle_dir, members) = session.span("unpack", || read_verified(session, args, bundle))?;
    let bom = manifest.lock;
    let (pki_dir, pki) = pki_of(&settings.root, args.dry_run, cluster)?;
    let (file_server, listen) = files_from(session, args, &phases, &topo, &bundle.digest)?;
    let ca_pem = pki.ca("registry", "kubexm registry CA")?.cert_pem;
    let installer = installer_binary(settings.installer.as_ref())?;
    let kubeadm_api = kubeadm_api(&bundle.catalog, cluster, &bundle.path)?;
    let kubeconfig = kubeconfig_path(settings, cluster);
    let kube = if phases.contains(&Phase::ControlPlane) || phases.contains(&Phase::Workers) {
        let mut kube = crate::kube_pki::KubePki::ensure(&pki)?;
        // A dry run names the join credentials a real run would reuse.
        if args.dry_run
            && let Some(c) = crate::kube_pki::fresh_credentials(&pki_dir.join("kubernetes"))
        {
            kube.creds = c;
        }
        Some(kube)
    } else {
        None
    };
    // The context, built once; a real run fills in the arches from facts.
    let mut ctx = Context {
        bundle: (!bundle.unpacked).then_some(bundle.path.as_path()),
        base: settings
            .base
            .as_deref()
            .filter(|_| !bundle.unpacked)
            .zip(bundle.manifest.base.as_ref().map(|b| b.digest.as_str())),
        digest: Some(bundle.digest.as_str()),
        written: written(session),
        operation: operation(args),
        pubkey: settings.pubkey.as_deref(),
        installer: &installer,
        cluster,
        topo,
        bom: &bom,
        bundle_dir: &bundle_dir,
        file_server: &file_server,
        ca_pem: &ca_pem,
        pki: &pki,
        kube,
        members: members.as_ref(),
        arches: cluster
            .spec
            .hosts
            .iter()
            .filter_map(|h| Some((h.name.clone(), h.arch.clone()?)))
            .collect(),
        phases: &phases,
        kubeadm_api: &kubeadm_api,
        kubeconfig: &kubeconfig,
        server_dry_run: args.server_dry_run,
        etcd_before: etcd_before(session, args)?,
        registry_before: installed(session)?.and_then(|r| r.config.spec.role_groups.registry.first().cloned()),
        files_from_registry: args.files_from_registry,
    };
    if args.dry_run {
        for h in &cluster.spec.hosts {
            ctx.arches.entry(h.name.clone()).or_insert_with(|| "amd64".into());
        }
        let plan = pipeline::pipeline(&ctx)?.plan()?;
        // An apply's plan leaves out what earlier jobs did: what it will run.
        let done = if args.apply {
            session.done_steps("apply")?
        } else {
            Default::default()
        };
        return Ok(InstallReport::Plan(plan.describe_without(&done)));
    }
    // One owner acts at a time: refused here, before anything is served.
    if args.server_dry_run {
        session.without_lease();
    } else {
        session.span("lease", || session.own())?;
    }
    // The file server runs for the install's duration (none when the
    // registry host serves the files).
    let _server = listen
        .map(|l| {
            session.span("serve", || {
                FileServer::start(session, serve_options(&bundle_dir, l, &pki_dir, &ctx.topo), &file_server)
            })
        })
        .transpose()?;
    let facts = session.span("facts", || session.facts())?;
    if !facts.errors.is_empty() {
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "cannot gather facts from {} host(s):\n  {}",
                facts.errors.len(),
                facts.errors.join("\n  ")
            ),
        ));
    }
    if phases.contains(&Phase::Preflight) {
        session.span("preflight", || preflight(cluster, &bom, &facts.facts, &phases))?;
    }
    ctx.arches = facts.facts.iter().map(|f| (f.host.clone(), f.arch.clone())).collect();
    let pipeline = session.span("plan", || match &args.upgrade {
        Some(hop) => crate::pipelines::upgrade::pipeline(&ctx, hop),
        None => pipeline::pipeline(&ctx),
    })?;
    let kind = ctx.operation;
    let ex = session.execute(kind, run::Policy::FailFast, |_| Ok(pipeline))?;
    // A server-side dry run changes no host: the record stays the last real job's.
    let kept = if args.server_dry_run {
        Ok(())
    } else {
        session.keep_record(ex.job, Some(&bom), &ctx.arches)
    };
    let skipped = ex.report.count(Outcome::Skipped);
    let applied = ex.report.count(Outcome::Applied);
    if !ex.ok() {
        if let Err(e) = &kept {
            tracing::warn!("{e:#}");
        }
        let errors = ex.errors();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "{kind} failed (job {}; {applied} steps applied, {skipped} skipped); fix and run again, done steps are skipped:\n  {}",
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    kept?;
    Ok(InstallReport::Installed(Installed {
        cluster: cluster.metadata.name.clone(),
        job: ex.job,
        phases: phases.clone(),
        hosts: cluster.spec.hosts.len(),
        applied,
        skipped,
        have: summary(cluster, &ctx.topo, &phases, &kubeconfig),
        timing: session.timing(ex.job),
    }))
}

/// Where the hosts fetch files: the file server this run starts (its URL
/// and the address it listens on), or the registry host's.
fn files_from(
    session: &Session,
    args: &InstallOptions,
    phases: &[Phase],
    topo: &kubexm_bom::topology::Topology,
    digest: &str,
) -> anyhow::Result<(String, Option<std::net::SocketAddr>)> {
    if args.files_from_registry {
        return Ok((registry_files(session, args, phases, topo, digest)?, None));
    }
    let settings = session.settings();
    let listen = std::net::SocketAddr::new(advertise(settings.advertise)?, settings.serve_port);
    Ok((format!("https://{listen}"), Some(listen)))
}

/// The registry host's file server (`https://address:port`), for
/// [`InstallOptions::files_from_registry`]: refused, saying why, unless the
/// cluster is installed and its registry host, unmoved, serves this bundle
/// (its registry phase, which runs first, makes sure of it).
fn registry_files(
    session: &Session,
    args: &InstallOptions,
    phases: &[Phase],
    topo: &kubexm_bom::topology::Topology,
    digest: &str,
) -> anyhow::Result<String> {
    let cluster = session.cluster();
    let name = &cluster.metadata.name;
    let unsupported = |m: String| op(OpError::Unsupported, anyhow::anyhow!(m));
    let usage = |m: String| op(OpError::Usage, anyhow::anyhow!(m));
    if args.upgrade.is_some() {
        return Err(unsupported(
            "files from the registry host in an upgrade are not supported yet (its hosts fetch the new bundle's files \
             before the registry serves it): run it with --advertise ADDR"
                .into(),
        ));
    }
    if cluster.spec.registry.client_auth {
        return Err(unsupported(format!(
            "files from the registry host with registry.clientAuth are not supported yet (cluster {name}: a host gets its \
             client certificate in the containerd phase, after it fetches its first files): run with --advertise ADDR"
        )));
    }
    let Some(record) = installed(session)? else {
        return Err(usage(format!(
            "cluster {name} is not installed: no registry host serves its files yet; install it with --advertise ADDR \
             (a file server on this machine)"
        )));
    };
    let Some(at) = &topo.registry else {
        return Err(usage(format!(
            "cluster {name} has no registry host (registry.mode local, roleGroups.registry) to fetch files from: \
             run with --advertise ADDR"
        )));
    };
    let before = record.config.spec.role_groups.registry.first();
    if before != Some(&at.host) {
        return Err(usage(format!(
            "cluster {name}'s registry moves from {} to {}: the new one serves no files until it is set up; \
             run with --advertise ADDR",
            before.map(String::as_str).unwrap_or("none"),
            at.host
        )));
    }
    if !phases.contains(&Phase::Registry) {
        return Err(usage(format!(
            "files from the registry host need the registry phase (it runs first and has {} serve this bundle): \
             add registry to --phases, or run with --advertise ADDR",
            at.host
        )));
    }
    if record.bundle.as_deref() != Some(digest) {
        return Err(usage(format!(
            "the registry host {} serves cluster {name}'s bundle {}, not {digest}: use that bundle, or run with --advertise ADDR",
            at.host,
            record.bundle.as_deref().unwrap_or("(not recorded)")
        )));
    }
    Ok(format!("https://{}:{}", topo.address(&at.host), cluster.spec.registry.port))
}

/// The file server of an install, stopped when dropped.
struct FileServer(tokio::task::JoinHandle<anyhow::Result<()>>);

impl FileServer {
    /// Starts it on the session's runtime and waits until it listens.
    fn start(session: &Session, opts: serve::ServeOptions, url: &str) -> anyhow::Result<FileServer> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let server = FileServer(session.spawn(serve::run(opts, move |_, _| {
            let _ = ready_tx.send(());
        }))?);
        if ready_rx.recv_timeout(std::time::Duration::from_secs(20)).is_err() {
            return Err(op(
                OpError::Io,
                anyhow::anyhow!("the file server did not start on {url}; is the port free and the address this machine's?"),
            ));
        }
        Ok(server)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Refuses the install when a host is not fit for it; warns of leftovers
/// the config lets pass.
fn preflight(
    cluster: &kubexm_bom::config::Cluster,
    bom: &kubexm_bom::Bom,
    facts: &[crate::engine::facts::HostFacts],
    phases: &[Phase],
) -> anyhow::Result<()> {
    let mut refused = crate::phases::preflight::refusals(cluster, bom, facts, phases);
    refused.extend(crate::endpoint::preflight(cluster));
    if cluster.spec.preflight.leftovers == kubexm_bom::config::model::LeftoverPolicy::Warn {
        for f in facts.iter().filter(|f| f.managed.is_empty() && !f.leftovers.is_empty()) {
            tracing::warn!(
                "{}: leftovers of an earlier install kubexm did not make: {} (preflight.leftovers: warn)",
                f.host,
                f.leftovers.join(" ")
            );
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(op(
        OpError::Host,
        anyhow::anyhow!("preflight refused the install:\n  {}", refused.join("\n  ")),
    ))
}

/// What the user has now, after a successful install: one line each.
fn summary(
    cluster: &kubexm_bom::config::Cluster,
    topo: &kubexm_bom::topology::Topology,
    phases: &[Phase],
    kubeconfig: &std::path::Path,
) -> Vec<String> {
    use kubexm_bom::topology::AddonPhase;
    let g = &cluster.spec.role_groups;
    let has = |p: Phase| phases.contains(&p);
    let name = |v: serde_json::Result<serde_json::Value>| v.ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    let mut s = Vec::new();
    if has(Phase::ControlPlane) {
        s.push(format!(
            "control plane: {} (endpoint {}, mode {})",
            g.control_plane.join(", "),
            topo.endpoint,
            name(serde_json::to_value(cluster.spec.control_plane_endpoint.mode))
        ));
        s.push(format!(
            "etcd: {} ({}, TLS)",
            g.etcd.join(", "),
            name(serde_json::to_value(cluster.spec.etcd.mode))
        ));
    }
    if has(Phase::Workers) {
        s.push(format!("nodes: {}", g.worker.join(", ")));
    }
    for (phase, want) in [(Phase::Cni, AddonPhase::Cni), (Phase::Addons, AddonPhase::Addons)] {
        if has(phase)
            && let Ok(list) = crate::phases::addons::enabled(topo, want)
            && !list.is_empty()
        {
            s.push(format!("{phase}: {}", list.join(", ")));
        }
    }
    if let Some(r) = topo.registry.as_ref().map(|r| &r.address).filter(|_| has(Phase::Registry)) {
        s.push(format!("registry: https://{r} (CA /etc/kubexm/pki/registry-ca.crt on every host)"));
    }
    if has(Phase::Kubeconfig) {
        s.push(format!(
            "kubeconfig: {} (server {}); try: kubectl --kubeconfig {} get nodes",
            kubeconfig.display(),
            topo.external_server,
            kubeconfig.display()
        ));
    }
    s
}

/// The phases asked for, refused when one cannot run here (yet, or in a
/// server dry run).
fn phases_of(args: &InstallOptions, file: &str, cluster: &kubexm_bom::config::Cluster) -> anyhow::Result<Vec<Phase>> {
    let asked = if args.phases.is_empty() {
        pipeline::PHASES.to_vec()
    } else {
        args.phases.clone()
    };
    let (phases, missing) = pipeline::select(&asked);
    if args.server_dry_run
        && let Some(other) = phases.iter().find(|p| !matches!(p, Phase::Cni | Phase::Addons))
    {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "--server-dry-run checks the cni and addons phases' manifests against an installed cluster; \
                 phase {other} cannot run that way: pass --phases cni,addons (or one of them)"
            ),
        ));
    }
    if !missing.is_empty() {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!(
                "{}: config valid (cluster {}); phase(s) {} are not supported yet, and nothing was touched. \
                 This release deploys --phases {}",
                file,
                cluster.metadata.name,
                crate::pipelines::names(&missing, ", "),
                crate::pipelines::names(pipeline::IMPLEMENTED, ",")
            ),
        ));
    }
    Ok(phases)
}

/// A verified bundle: its manifest, where it is (or would be) unpacked, and
/// (a dry run) its `manifests/...` members in memory.
type ReadBundle = (
    kubexm_bundle::manifest::BundleManifest,
    PathBuf,
    Option<std::collections::BTreeMap<String, Vec<u8>>>,
);

/// The bundle verified against its signature: planned from in memory (a
/// dry run) or unpacked; refused when it changed since `early` was read or
/// is not the bundle the job asked for.
fn read_verified(session: &Session, args: &InstallOptions, opened: &OpenBundle) -> anyhow::Result<ReadBundle> {
    let (bundle, early, root) = (&opened.path, &opened.manifest, &session.settings().root);
    // Unpacked here before: verified then (it is marked complete only after).
    if opened.unpacked {
        return Ok((early.clone(), bundle.clone(), None));
    }
    let t = unpack::Trust::of(session.settings().pubkey.as_deref());
    // A dry run verifies the bundle and plans from it in memory: it writes
    // nothing anywhere (no unpack, no PKI, no state); values made at apply
    // time print as <generated>.
    // A differential bundle's base (`--base`, or held beside it by a
    // worker), which the registry host needs too: refused without it.
    let base = session.settings().base.as_deref().filter(|_| early.base.is_some());
    unpack::check_deploy(bundle, early, base, &t, false).map_err(unpack::UnpackError::classified)?;
    let (manifest, bundle_dir, members, digest) = if args.dry_run {
        let p = unpack::read_for_plan(bundle, base, &t, root).map_err(unpack::UnpackError::classified)?;
        (p.manifest, p.dir, Some(p.members), p.digest)
    } else {
        if let Some(base) = base {
            unpack::unpack_base(bundle, base, &t, root).map_err(unpack::UnpackError::classified)?;
        }
        let u = unpack::unpack(bundle, &t, root).map_err(unpack::UnpackError::classified)?;
        (u.manifest, u.dir, None, u.digest)
    };
    if &manifest != early {
        return Err(op(
            OpError::Verify,
            anyhow::anyhow!("{}: the bundle changed while it was read; run again", bundle.display()),
        ));
    }
    if let Some(want) = &args.expect_digest
        && digest != *want
    {
        return Err(op(
            OpError::Verify,
            anyhow::anyhow!(
                "{} is not the bundle this job asked for: its signed bundle.yaml is {digest}, the job's {want}. The held file was replaced; nothing was installed. Add the bundle again with `kubexm bundle add`",
                bundle.display(),
            ),
        ));
    }
    Ok((manifest, bundle_dir, members))
}

/// Where the admin kubeconfig of `cluster` is written for the user.
pub(super) fn kubeconfig_path(settings: &super::session::Settings, cluster: &kubexm_bom::config::Cluster) -> PathBuf {
    settings
        .kubeconfig
        .clone()
        .unwrap_or_else(|| settings.root.join(format!("{}.kubeconfig", cluster.metadata.name)))
}

/// The cluster's PKI directory, and the PKI planning reads (placeholders
/// in a dry run, which writes nothing).
pub(super) fn pki_of(
    root: &std::path::Path,
    dry_run: bool,
    cluster: &kubexm_bom::config::Cluster,
) -> anyhow::Result<(PathBuf, crate::pki::Pki)> {
    let name = &cluster.metadata.name;
    // A dry run writes nothing: an old single-cluster root is moved only by a real run.
    let pki_dir = if dry_run {
        crate::paths::cluster_pki(root, name)
    } else {
        super::cluster_pki(root, name)?
    };
    let pki = if dry_run {
        crate::pki::Pki::DryRun
    } else {
        crate::pki::Pki::Dir(pki_dir.clone(), crate::pki::Leaf::of(cluster))
    };
    Ok((pki_dir, pki))
}

/// The kubeadm API version the bundle's lock pairs with the cluster's Kubernetes.
fn kubeadm_api(
    catalog: &kubexm_bom::catalog::Catalog,
    cluster: &kubexm_bom::config::Cluster,
    bundle: &std::path::Path,
) -> anyhow::Result<String> {
    catalog
        .minor(&cluster.spec.kubernetes.version)
        .map(|m| m.kubeadm_api_version.clone())
        .ok_or_else(|| {
            op(
                OpError::Config,
                anyhow::anyhow!(
                    "{}: the bundle's lock has no kubeadm API for Kubernetes {}; rebuild it with this kubexm-bundle",
                    bundle.display(),
                    cluster.spec.kubernetes.version
                ),
            )
        })
}

/// The address hosts reach this machine at, for the file server.
fn advertise(given: Option<std::net::IpAddr>) -> anyhow::Result<std::net::IpAddr> {
    let Some(advertise) = given else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "pass --advertise ADDR: the address the hosts reach this machine at, for the file server \
                 (or, on an installed cluster, --files-from-registry: the registry host serves the files)"
            ),
        ));
    };
    Ok(advertise)
}

/// The kubexm-install binary the registry host runs: the one given, or this one.
fn installer_binary(given: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(p) => Ok(p.clone()),
        None => anyhow::Context::context(std::env::current_exe(), "finding the installer binary"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fixture::{CONFIG, Fixture};

    /// Files from the registry host: taken only where the installed
    /// cluster's registry host serves this very bundle; an upgrade and
    /// `registry.clientAuth` are not supported yet (exit 8).
    #[test]
    fn files_come_from_the_registry_host_only_when_it_serves_this_bundle() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        let digest = format!("sha256:{}", "ab".repeat(32));
        let files = |text: &str, args: &InstallOptions| -> anyhow::Result<Result<String, (bool, String)>> {
            let s = f.session(text)?;
            let topo = kubexm_bom::topology::Topology::of(s.cluster())?;
            Ok(registry_files(&s, args, crate::pipelines::install::PHASES, &topo, &digest)
                .map_err(|e| (matches!(OpError::find(&e), Some(OpError::Unsupported(_))), format!("{e:#}"))))
        };
        let asked = InstallOptions {
            files_from_registry: true,
            ..Default::default()
        };
        // The record names no bundle yet.
        let e = files(CONFIG, &asked)?.err().unwrap_or_default();
        assert!(e.1.contains("serves cluster s's bundle (not recorded), not sha256:abab"), "{e:?}");
        let s = f.session(CONFIG)?;
        let rec = f.record()?;
        s.put_record(rec.job.id, &[], |job| kubexm_bom::record::ClusterRecord {
            job,
            bundle: Some(digest.clone()),
            ..rec.clone()
        })?;
        let url = files(CONFIG, &asked)?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert!(url.starts_with("https://10.0.0.1:"), "{url}");
        let client_auth = format!("{CONFIG}\x20 registry: {{clientAuth: true}}\n");
        let e = files(&client_auth, &asked)?.err().unwrap_or_default();
        assert!(e.0, "{e:?}");
        assert!(e.1.contains("registry.clientAuth are not supported yet"), "{e:?}");
        // A registry that moves serves no files yet.
        let moved = CONFIG.replace("worker: [b, c, d]}", "worker: [b, c, d], registry: [b]}");
        let e = files(&moved, &asked)?.err().unwrap_or_default();
        assert!(!e.0 && e.1.contains("registry moves from a to b"), "{e:?}");
        // Without the registry phase nothing has the registry host serve this bundle.
        let s = f.session(CONFIG)?;
        let topo = kubexm_bom::topology::Topology::of(s.cluster())?;
        let e = registry_files(&s, &asked, &[Phase::Workers], &topo, &digest).unwrap_or_else(|e| format!("{e:#}"));
        assert!(e.contains("add registry to --phases"), "{e}");
        Ok(())
    }
}
