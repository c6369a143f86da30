//! `kubexm-install --bundle -f cluster.yaml`: verify and unpack the bundle,
//! serve it, gather facts, run preflight and the install pipeline as one
//! engine job. `dry_run` plans from the verified bundle in memory and
//! writes nothing.

use std::path::PathBuf;

use crate::ops::error::{OpError, op};

use super::{EngineSettings, engine_context};
use crate::context::Context;
use crate::engine::{jobs, run};
use crate::pipelines::install as pipeline;
use crate::{serve, unpack};

/// What `install` is asked to do (flags, validated by the binary).
#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub bundle: Option<PathBuf>,
    pub file: Option<PathBuf>,
    /// The bundle's public key; `None` with `allow_unsigned`.
    pub pubkey: Option<PathBuf>,
    pub allow_unsigned: bool,
    pub root: PathBuf,
    /// Empty: every phase.
    pub phases: Vec<String>,
    pub advertise: Option<std::net::IpAddr>,
    pub serve_port: u16,
    pub kubeconfig: Option<PathBuf>,
    pub dry_run: bool,
    /// Only the cni and addons phases: their manifests checked by the API
    /// server (`kubectl apply --dry-run=server`), CRDs and Namespaces created.
    pub server_dry_run: bool,
    /// The kubexm-install binary the registry host runs as its registry
    /// service. `None`: this process's own (kubexm-install itself).
    pub installer: Option<PathBuf>,
    /// The bundle the job asked for (`sha256:<hex>` of its signed
    /// `bundle.yaml`): any other, even one signed, is refused once read.
    pub expect_digest: Option<String>,
    pub engine: EngineSettings,
}

/// What `install` did.
#[derive(Debug)]
pub enum InstallReport {
    /// `dry_run`: the plan, per phase and host.
    Plan(String),
    /// What was installed, and what the user has now.
    Installed(String),
}

/// `file` checked against the catalog `bundle` carries (its first member,
/// bundle.yaml, read without unpacking anything): what an install, and a
/// job that will run one, checks first. The config's own errors come first
/// even without a readable bundle (only its versions need the catalog).
pub fn validate(
    file: &std::path::Path,
    bundle: &std::path::Path,
) -> anyhow::Result<(kubexm_bundle::manifest::BundleManifest, kubexm_bom::config::Cluster)> {
    let early = match kubexm_bundle::verify::read_manifest(bundle) {
        Ok(m) => m,
        Err(e) => {
            kubexm_bom::config::load_file_hosts(file)?;
            return Err(unpack::UnpackError::from(e).classified());
        }
    };
    let cluster = kubexm_bom::config::load_file(file, &super::lock_catalog(&early, bundle)?)?;
    Ok((early, cluster))
}

pub fn install(args: &InstallOptions) -> anyhow::Result<InstallReport> {
    let (file, bundle) = inputs(args)?;
    // The config is checked against the catalog the bundle carries before
    // anything is unpacked; the verified copy read below is the one planned from.
    let (early, cluster) = validate(&file, bundle)?;
    let phases = phases_of(args, &file, &cluster)?;
    let topo = kubexm_bom::topology::Topology::of(&cluster).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
    let (manifest, bundle_dir, members) = read_verified(args, bundle, &early)?;
    let catalog = super::lock_catalog(&manifest, bundle)?;
    let bom = manifest.lock;
    let (pki_dir, pki) = pki_of(args, &cluster.metadata.name)?;
    let advertise = advertise(args)?;
    let file_server = format!("https://{}", std::net::SocketAddr::new(advertise, args.serve_port));
    let ca_pem = pki.ca("registry", "kubexm registry CA")?.cert_pem;
    let installer = installer_binary(args)?;
    let kubeadm_api = kubeadm_api(&catalog, &cluster, bundle)?;

    let kubeconfig = args
        .kubeconfig
        .clone()
        .unwrap_or_else(|| args.root.join(format!("{}.kubeconfig", cluster.metadata.name)));
    let kube = if phases.iter().any(|p| p == "control-plane" || p == "workers") {
        Some(crate::kube_pki::KubePki::ensure(&pki)?)
    } else {
        None
    };
    // The context, built once; a real run fills in the arches from facts.
    let mut ctx = Context {
        bundle,
        pubkey: args.pubkey.as_deref(),
        installer: &installer,
        cluster: &cluster,
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
    };
    if args.dry_run {
        for h in &cluster.spec.hosts {
            ctx.arches.entry(h.name.clone()).or_insert_with(|| "amd64".into());
        }
        return Ok(InstallReport::Plan(pipeline::pipeline(&ctx)?.plan()?.describe()));
    }
    let (state, stop, rt) = engine_context(&cluster, &args.engine)?;
    // The file server runs for the install's duration.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let opts = serve::ServeOptions {
        bundle_dir: bundle_dir.clone(),
        listen: std::net::SocketAddr::new(advertise, args.serve_port),
        tls: serve::Tls::Issued {
            pki_dir: pki_dir.join("registry"),
            names: vec![advertise.to_string()],
        },
        parts: serve::Parts {
            registry: true,
            files: true,
        },
        limits: serve::ConnectionLimits::for_nodes(&ctx.topo),
        client_ca: None,
    };
    let server = rt.spawn(serve::run(opts, move |_, _| {
        let _ = ready_tx.send(());
    }));
    if ready_rx.recv_timeout(std::time::Duration::from_secs(20)).is_err() {
        server.abort();
        return Err(op(
            OpError::Io,
            anyhow::anyhow!("the file server did not start on {file_server}; is the port free and the address this machine's?"),
        ));
    }
    let connect = args.engine.connect();
    let facts = rt.block_on(jobs::facts(
        &cluster,
        state.clone(),
        &connect,
        args.engine.events.clone(),
        stop.clone(),
    ))?;
    if !facts.errors.is_empty() {
        server.abort();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "cannot gather facts from {} host(s):\n  {}",
                facts.errors.len(),
                facts.errors.join("\n  ")
            ),
        ));
    }
    if phases.iter().any(|p| p == "preflight") {
        let mut refused = crate::phases::preflight::refusals(&cluster, &bom, &facts.facts, &phases);
        refused.extend(crate::endpoint::preflight(&cluster));
        if cluster.spec.preflight.leftovers == kubexm_bom::config::model::LeftoverPolicy::Warn {
            for f in facts.facts.iter().filter(|f| f.managed.is_empty() && !f.leftovers.is_empty()) {
                tracing::warn!(
                    "{}: leftovers of an earlier install kubexm did not make: {} (preflight.leftovers: warn)",
                    f.host,
                    f.leftovers.join(" ")
                );
            }
        }
        if !refused.is_empty() {
            server.abort();
            return Err(op(
                OpError::Host,
                anyhow::anyhow!("preflight refused the install:\n  {}", refused.join("\n  ")),
            ));
        }
    }
    ctx.arches = facts.facts.iter().map(|f| (f.host.clone(), f.arch.clone())).collect();
    let pipeline = pipeline::pipeline(&ctx)?;
    let eo = args.engine.options(run::Policy::FailFast);
    let ex = rt.block_on(jobs::execute(&cluster, state, "install", &connect, &eo, stop, |_| Ok(pipeline)));
    server.abort();
    let ex = ex?;
    let skipped = ex.report.count(crate::engine::state::Outcome::Skipped);
    let applied = ex.report.count(crate::engine::state::Outcome::Applied);
    if !ex.ok() {
        let errors = ex.errors();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "install failed (job {}; {applied} steps applied, {skipped} skipped); fix and run again, done steps are skipped:\n  {}",
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    Ok(InstallReport::Installed(format!(
        "installed phases {} on {} hosts (job {}): {applied} steps applied, {skipped} already in place\n{}",
        phases.join(", "),
        cluster.spec.hosts.len(),
        ex.job,
        summary(&cluster, &ctx.topo, &phases, &kubeconfig)
    )))
}

/// What the user has now, after a successful install.
fn summary(
    cluster: &kubexm_bom::config::Cluster,
    topo: &kubexm_bom::topology::Topology,
    phases: &[String],
    kubeconfig: &std::path::Path,
) -> String {
    use kubexm_bom::topology::AddonPhase;
    let g = &cluster.spec.role_groups;
    let has = |p: &str| phases.iter().any(|x| x == p);
    let mut s = String::new();
    s.push_str(&format!(
        "cluster {}:
",
        cluster.metadata.name
    ));
    if has("control-plane") {
        s.push_str(&format!(
            "  control plane: {} (endpoint {}, mode {})
",
            g.control_plane.join(", "),
            topo.endpoint,
            serde_json::to_value(cluster.spec.control_plane_endpoint.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        ));
        let mode = serde_json::to_value(cluster.spec.etcd.mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        s.push_str(&format!(
            "  etcd: {} ({mode}, TLS)
",
            g.etcd.join(", ")
        ));
    }
    if has("workers") {
        s.push_str(&format!(
            "  nodes: {}
",
            g.worker.join(", ")
        ));
    }
    for (phase, want) in [("cni", AddonPhase::Cni), ("addons", AddonPhase::Addons)] {
        if has(phase)
            && let Ok(list) = crate::phases::addons::enabled(topo, want)
            && !list.is_empty()
        {
            s.push_str(&format!(
                "  {phase}: {}
",
                list.join(", ")
            ));
        }
    }
    if let Some(r) = topo.registry.as_ref().map(|r| &r.address).filter(|_| has("registry")) {
        s.push_str(&format!(
            "  registry: https://{r} (CA /etc/kubexm/pki/registry-ca.crt on every host)
"
        ));
    }
    if has("kubeconfig") {
        s.push_str(&format!(
            "  kubeconfig: {} (server {}); try: kubectl --kubeconfig {} get nodes
",
            kubeconfig.display(),
            topo.external_server,
            kubeconfig.display()
        ));
    }
    s
}

/// The config file and bundle an install needs, and a signature policy.
fn inputs(args: &InstallOptions) -> anyhow::Result<(PathBuf, &std::path::Path)> {
    let Some(file) = args.file.clone() else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("nothing to do: pass -f cluster.yaml --bundle k.tar.zst to install, or a subcommand (see --help)"),
        ));
    };
    let Some(bundle) = args.bundle.as_deref() else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("pass --bundle k.tar.zst (built by kubexm-bundle)"),
        ));
    };
    if args.pubkey.is_none() && !args.allow_unsigned {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("pass --pubkey FILE to verify the bundle's signature (or --allow-unsigned)"),
        ));
    }
    Ok((file, bundle))
}

/// The phases asked for, refused when one cannot run here (yet, or in a
/// server dry run).
fn phases_of(args: &InstallOptions, file: &std::path::Path, cluster: &kubexm_bom::config::Cluster) -> anyhow::Result<Vec<String>> {
    let asked: Vec<String> = if args.phases.is_empty() {
        pipeline::PHASES.iter().map(|p| p.to_string()).collect()
    } else {
        args.phases.clone()
    };
    let (phases, missing) = pipeline::select(&asked).map_err(|e| op(OpError::Usage, anyhow::anyhow!("--phases: {e}")))?;
    if args.server_dry_run
        && let Some(other) = phases.iter().find(|p| *p != "cni" && *p != "addons")
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
                file.display(),
                cluster.metadata.name,
                missing.join(", "),
                pipeline::IMPLEMENTED.join(",")
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
fn read_verified(
    args: &InstallOptions,
    bundle: &std::path::Path,
    early: &kubexm_bundle::manifest::BundleManifest,
) -> anyhow::Result<ReadBundle> {
    let t = match &args.pubkey {
        Some(k) => unpack::Trust::PublicKey(k.clone()),
        None => unpack::Trust::Unsigned,
    };
    // A dry run verifies the bundle and plans from it in memory: it writes
    // nothing anywhere (no unpack, no PKI, no state); values made at apply
    // time print as <generated>.
    let (manifest, bundle_dir, members) = if args.dry_run {
        let p = unpack::read_for_plan(bundle, &t, &args.root).map_err(unpack::UnpackError::classified)?;
        (p.manifest, p.dir, Some(p.members))
    } else {
        let u = unpack::unpack(bundle, &t, &args.root).map_err(unpack::UnpackError::classified)?;
        (u.manifest, u.dir, None)
    };
    if &manifest != early {
        return Err(op(
            OpError::Verify,
            anyhow::anyhow!("{}: the bundle changed while it was read; run again", bundle.display()),
        ));
    }
    if let Some(want) = &args.expect_digest {
        let got = bundle_dir.file_name().map(|n| format!("sha256:{}", n.to_string_lossy()));
        if got.as_deref() != Some(want.as_str()) {
            return Err(op(
                OpError::Verify,
                anyhow::anyhow!(
                    "{} is not the bundle this job asked for: its signed bundle.yaml is {}, the job's {want}. The held file was replaced; nothing was installed. Add the bundle again with `kubexm bundle add`",
                    bundle.display(),
                    got.unwrap_or_default()
                ),
            ));
        }
    }
    Ok((manifest, bundle_dir, members))
}

/// The cluster's PKI directory, and the PKI planning reads (placeholders
/// in a dry run, which writes nothing).
fn pki_of(args: &InstallOptions, name: &str) -> anyhow::Result<(PathBuf, crate::pki::Pki)> {
    // A dry run writes nothing: an old single-cluster root is moved only by a real run.
    let pki_dir = if args.dry_run {
        crate::paths::cluster_pki(&args.root, name)
    } else {
        super::cluster_pki(&args.root, name)?
    };
    let pki = if args.dry_run {
        crate::pki::Pki::DryRun
    } else {
        crate::pki::Pki::Dir(pki_dir.clone())
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
fn advertise(args: &InstallOptions) -> anyhow::Result<std::net::IpAddr> {
    let Some(advertise) = args.advertise else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("pass --advertise ADDR: the address the hosts reach this machine at, for the file server"),
        ));
    };
    Ok(advertise)
}

/// The kubexm-install binary the registry host runs: the one given, or this one.
fn installer_binary(args: &InstallOptions) -> anyhow::Result<PathBuf> {
    match args.installer.clone() {
        Some(p) => Ok(p),
        None => anyhow::Context::context(std::env::current_exe(), "finding the installer binary"),
    }
}
