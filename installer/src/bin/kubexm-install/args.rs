//! `kubexm-install`'s flags (clap derive): what each command takes.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use kubexm_cli::Output;

/// Install a Kubernetes cluster from a kubexm bundle, with no internet.
#[derive(Parser)]
#[command(
    name = "kubexm-install",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true,
    after_help = "Exit codes: 0 ok, 1 bug, 2 usage, 3 invalid config, 4 file I/O, 5 fetch, 6 verification, 7 host, 8 not supported yet, 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub install: InstallArgs,
    /// No longer taken: the bundle's lock carries what the offline side needs
    /// from the catalog. Refused with that message.
    #[arg(long = "catalog", value_name = "FILE", global = true, hide = true)]
    pub catalog: Vec<PathBuf>,
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Args)]
pub struct InstallArgs {
    /// The bundle (.tar.zst) built by kubexm-bundle.
    #[arg(long, value_name = "FILE")]
    pub bundle: Option<PathBuf>,
    /// The cluster config (cluster.yaml).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The bundle's minisign public key.
    #[arg(long, value_name = "FILE")]
    pub pubkey: Option<PathBuf>,
    /// Accept a bundle without checking a signature (warns loudly).
    #[arg(long)]
    pub allow_unsigned: bool,
    /// The base of a differential --bundle (the full bundle it was built against): verified
    /// with --pubkey and unpacked under --root first. Not needed once it is unpacked there.
    #[arg(long, value_name = "FILE", requires = "bundle")]
    pub base: Option<PathBuf>,
    /// The installer's state root (unpacked bundles, PKI).
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub root: PathBuf,
    /// Phases to run, comma-separated, in order: preflight, os-packages, registry, etcd,
    /// loadbalancer, containerd, control-plane, workers, cni, addons, kubeconfig, operator. Default: all.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub phases: Vec<String>,
    #[command(flatten)]
    pub served: ServedArgs,
    /// Hosts fetch the bundle's files from the registry host's kubexm-registry instead of a
    /// file server on this machine (no --advertise needed): for an installed cluster whose
    /// registry host serves this bundle; not with registry.clientAuth, not for an upgrade.
    #[arg(long, conflicts_with_all = ["advertise", "serve_port"])]
    pub files_from_registry: bool,
    /// Print the plan and touch no host.
    #[arg(long)]
    pub dry_run: bool,
    /// With --phases cni,addons on an installed cluster: have the API server check the
    /// addons' manifests (kubectl apply --dry-run=server) without running them; their
    /// CustomResourceDefinitions and Namespaces are created, nothing else changes.
    #[arg(long)]
    pub server_dry_run: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args)]
pub struct UpgradeArgs {
    /// The cluster config (cluster.yaml), naming the version to upgrade to.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// A bundle built by kubexm-bundle: the one for the config's version, and one for each
    /// minor in between (repeat the flag; any order).
    #[arg(long, value_name = "FILE", required = true)]
    pub bundle: Vec<PathBuf>,
    /// A NotReady worker to leave at its version (repeatable); it is checked against the
    /// version skew policy at every hop.
    #[arg(long = "skip-not-ready", value_name = "HOST")]
    pub skip_not_ready: Vec<String>,
    /// Each drain's time limit (default: the config's spec.upgrade.drainTimeoutSeconds,
    /// 600); a drain that does not finish in time stops the run, the node left cordoned.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub drain_timeout: Option<u32>,
    /// Print the chain of hops (after reading each node's version from the API server);
    /// change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub served: ServedArgs,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `serve`'s flags.
#[derive(Args)]
pub struct ServeArgs {
    /// The unpacked bundle (from `unpack`).
    #[arg(long, value_name = "DIR")]
    pub bundle_dir: PathBuf,
    /// An older unpacked bundle served below it (what --bundle-dir lacks is
    /// served from it): an upgrade's nodes pull the old version or the new.
    /// Repeatable, newest first.
    #[arg(long = "older-bundle-dir", value_name = "DIR")]
    pub older: Vec<PathBuf>,
    /// Address and port to listen on.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:5443")]
    pub listen: std::net::SocketAddr,
    /// Serve this certificate (PEM) instead of issuing one from the installer's CA.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A name or address the issued certificate must cover. Repeatable; the listen address is always included.
    #[arg(long = "tls-san", value_name = "NAME")]
    pub tls_sans: Vec<String>,
    /// Where the installer's registry CA lives.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubexm/pki/registry")]
    pub pki_dir: PathBuf,
    /// Plain HTTP, no TLS.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_sans"])]
    pub plain_http: bool,
    /// Serve only the file server.
    #[arg(long, conflicts_with = "no_files")]
    pub no_registry: bool,
    /// Serve only the registry.
    #[arg(long)]
    pub no_files: bool,
    /// Require a client certificate signed by this CA (PEM) in the TLS handshake.
    #[arg(long, value_name = "FILE", conflicts_with = "plain_http")]
    pub client_ca: Option<PathBuf>,
    /// Connections open at once from addresses other than --node; one more is closed at once.
    #[arg(long, value_name = "N", default_value_t = kubexm_installer::serve::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Connections one address may hold (a --node too).
    #[arg(long, value_name = "N", default_value_t = kubexm_installer::serve::MAX_PER_SOURCE)]
    pub max_per_source: usize,
    /// A node's address: its connections do not count against --max-connections. Repeatable.
    #[arg(long = "node", value_name = "ADDR")]
    pub nodes: Vec<std::net::IpAddr>,
}

/// Where the installer serves the bundle from during a job, and where the
/// admin kubeconfig goes.
#[derive(Args, Clone)]
pub struct ServedArgs {
    /// The address hosts reach this machine at; the file server listens there (port --serve-port).
    #[arg(long, value_name = "ADDR")]
    pub advertise: Option<std::net::IpAddr>,
    /// Port of the file server the installer runs during the job.
    #[arg(long, default_value_t = kubexm_installer::SERVE_PORT)]
    pub serve_port: u16,
    /// Where to write the admin kubeconfig (mode 0600). Default: <root>/<cluster>.kubeconfig.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct TrustArgs {
    /// The bundle's minisign public key; `<bundle>.minisig` is checked before anything is decompressed.
    #[arg(long, value_name = "FILE", required_unless_present = "allow_unsigned")]
    pub pubkey: Option<PathBuf>,
    /// Accept a bundle without checking a signature (warns loudly).
    #[arg(long)]
    pub allow_unsigned: bool,
    /// The installer's state root.
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub root: PathBuf,
    /// The base of a differential bundle (the full bundle it was built against): verified
    /// with --pubkey and unpacked under --root first. Not needed once it is unpacked there.
    #[arg(long, value_name = "FILE")]
    pub base: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct EngineArgs {
    /// The state database.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    pub state: PathBuf,
    /// Accept a host key that differs from the one pinned at first contact.
    #[arg(long)]
    pub accept_new_host_key: bool,
    /// Hosts worked on at once.
    #[arg(long, default_value_t = 20)]
    pub concurrency: usize,
    /// Seconds one SSH connection attempt may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    pub connect_timeout: u64,
    /// Connection attempts per host (only refused or dropped connections are retried).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub connect_attempts: u32,
    /// Change a cluster in operator mode without taking its controller's
    /// Lease (kubexm-system/kubexm-controller-manager): for when the
    /// controller is broken; it and this command may then act at once.
    #[arg(long)]
    pub force_local: bool,
}

/// What an operation on an installed cluster's hosts takes.
#[derive(Args)]
pub struct ClusterArgs {
    /// The cluster's config (cluster.yaml).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Hosts known to be down, comma-separated: never contacted.
    #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
    pub unreachable: Vec<String>,
    /// The installer's state root.
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub root: PathBuf,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Verify a bundle and unpack it into <root>/bundles/<id>/ (a no-op if already there).
    Unpack {
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        #[command(flatten)]
        trust: TrustArgs,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Serve an unpacked bundle as a read-only OCI registry and file server.
    Serve(ServeArgs),
    /// Push the bundle's images into a site registry.
    Mirror {
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        #[command(flatten)]
        trust: TrustArgs,
        /// HOST[:PORT][/PREFIX] of the site registry.
        #[arg(long, value_name = "HOST[:PORT][/PREFIX]")]
        registry: String,
        /// Name images <prefix>/<repository>, without the upstream host; refused on collisions.
        #[arg(long)]
        flatten: bool,
        #[arg(long, value_name = "USER", requires = "password_stdin")]
        username: Option<String>,
        /// Read the password from standard input.
        #[arg(long, requires = "username")]
        password_stdin: bool,
        /// Trust this CA for the registry's certificate.
        #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
        ca_file: Option<PathBuf>,
        /// Do not verify the registry's certificate.
        #[arg(long)]
        insecure: bool,
        /// Talk plain HTTP to the registry.
        #[arg(long)]
        plain_http: bool,
        /// Parallel uploads.
        #[arg(long, default_value_t = 8)]
        jobs: usize,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Connect to every host of the config and gather its facts (OS, arch, ports, clock, leftovers).
    Facts {
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Hosts known to be down, comma-separated: never contacted, left out of the job.
        #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
        unreachable: Vec<String>,
        #[command(flatten)]
        engine: EngineArgs,
        /// Print the plan and touch no host.
        #[arg(long)]
        dry_run: bool,
        /// Write the plan's DAG as Graphviz DOT to FILE.
        #[arg(long, value_name = "FILE")]
        graph: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Install each host's OS packages (those its roles need) from a served bundle's Debian repositories.
    Packages {
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// The unpacked bundle (its lock lists the repositories).
        #[arg(long, value_name = "DIR")]
        bundle_dir: PathBuf,
        /// The file server as the hosts reach it (https://HOST:PORT), e.g. `kubexm-install serve`; plain http is refused.
        #[arg(long, value_name = "URL")]
        file_server: String,
        /// Path on the hosts of the file server's CA certificate (for https).
        #[arg(long, value_name = "PATH")]
        host_ca: Option<String>,
        /// Print the plan and touch no host.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Undo an install on every host of the config: services, files, binaries, the
    /// etcd data (packages stay). Without --yes it only says what it would do.
    Reset {
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Really reset: this deletes the cluster, including its etcd data.
        #[arg(long)]
        yes: bool,
        /// Hosts known to be down, comma-separated: never contacted, left out of the job.
        #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
        unreachable: Vec<String>,
        /// The installer's state root (the admin kubeconfig written there is removed).
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// etcd of an installed cluster: `snapshot`.
    #[command(subcommand)]
    Etcd(EtcdCommand),
    /// Take hosts out of an installed cluster: `node`.
    #[command(subcommand)]
    Remove(RemoveCommand),
    /// Certificates of an installed cluster: `check`.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// The end of a cluster: `cluster`.
    #[command(subcommand)]
    Delete(DeleteCommand),
    /// Change an installed cluster to what its config now says, running only what the
    /// difference needs: hosts added as workers, control-plane nodes and etcd members. Checked
    /// against the cluster's record first: a field that can never change exits 3, a change
    /// apply does not make yet exits 8, before any host is touched. Without --bundle, the
    /// bundle the cluster was installed from, as unpacked under --root. --dry-run prints the
    /// change and the steps that would run.
    Apply(InstallArgs),
    /// Upgrade an installed cluster to the Kubernetes version its config now names, one
    /// minor at a time. Checked first, before any change: no downgrade, a bundle for every
    /// minor in between (--bundle once per hop), every kubelet within the version skew
    /// policy at every hop, every artifact of every hop in its bundle, every node Ready
    /// (or a NotReady worker named by --skip-not-ready), every certificate valid for the
    /// hop. --dry-run prints the chain of hops. Then hop after hop: an etcd snapshot, the
    /// nodes one at a time (workers in batches of spec.upgrade.maxUnavailable), cordoned,
    /// drained, upgraded, Ready and uncordoned. A run stopped anywhere goes on when run again.
    Upgrade(UpgradeArgs),
    /// Show a job: each module and host, and the log tail of each failed
    /// step; with --timeline, where its time went, as a picture; with
    /// --cluster, the cluster's record (what its last job applied).
    Status {
        /// The job (default: the latest).
        #[arg(long)]
        job: Option<i64>,
        /// Show the record of cluster NAME instead of a job: its nodes and
        /// roles, versions, the bundle's digest and the last job's result
        /// (-o json: the whole record, the completed config included).
        #[arg(long, value_name = "NAME", conflicts_with_all = ["job", "timeline", "from"])]
        cluster: Option<String>,
        /// The state database.
        #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
        state: PathBuf,
        /// Write the job's timeline to FILE: an SVG (a lane per host, a bar
        /// per step coloured by phase, waits hatched, the critical path
        /// outlined), or with -o json the same data as JSON.
        #[arg(long, value_name = "FILE")]
        timeline: Option<PathBuf>,
        /// Draw a timeline written earlier as JSON (by -o json, the API's
        /// /api/v1/jobs/{id}/timeline, or a script) instead of a job of the
        /// state database.
        #[arg(long, value_name = "FILE", requires = "timeline", conflicts_with = "job")]
        from: Option<PathBuf>,
        /// text: the job's steps (and an SVG timeline); json: the timeline
        /// as JSON (to --timeline FILE, else on stdout), or the cluster's record.
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Run Kubernetes' conformance tests from the bundle against an installed cluster
    /// (e2e.test under ginkgo, from this machine); results under <root>/conformance/<cluster>/.
    /// Exits 7 when a spec fails.
    Conformance(ConformanceArgs),
    /// Write containerd hosts.toml files pointing every upstream of the bundle at a registry.
    HostsToml {
        #[arg(long, value_name = "DIR")]
        bundle_dir: PathBuf,
        /// HOST[:PORT][/PREFIX] of the registry nodes pull from.
        #[arg(long, value_name = "HOST[:PORT][/PREFIX]")]
        registry: String,
        #[arg(long)]
        flatten: bool,
        /// The CA certificate's path on the nodes.
        #[arg(long, value_name = "PATH")]
        ca: Option<String>,
        #[arg(long)]
        plain_http: bool,
        /// Output directory (containerd's config_path, e.g. /etc/containerd/certs.d).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// `conformance --mode`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ConformanceMode {
    Quick,
    Certified,
}

/// `conformance`'s flags.
#[derive(Args)]
pub struct ConformanceArgs {
    /// The cluster (metadata.name), as the state database recorded its install.
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// quick: a listed subset of 56 specs (minutes); certified: every conformance
    /// spec, serial ones included, as the Certified Kubernetes program runs them (hours).
    #[arg(long, value_enum, default_value = "quick")]
    pub mode: ConformanceMode,
    /// A Ginkgo regular expression selecting specs, in place of the mode's.
    #[arg(long, value_name = "REGEX")]
    pub focus: Option<String>,
    /// A Ginkgo regular expression of specs to leave out, beside the mode's.
    #[arg(long, value_name = "REGEX")]
    pub skip: Option<String>,
    /// Specs run at once (serial specs still run alone, at the end).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub parallel: usize,
    /// Nodes that may be NotReady during the run, comma-separated (named in the summary).
    #[arg(long, value_delimiter = ',', value_name = "NODES")]
    pub allow_not_ready: Vec<String>,
    /// Attempts at a failing spec: one that passes on a later attempt is reported
    /// as flaky, not failed (1: none; a certification run takes 1).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=5))]
    pub flake_attempts: u32,
    /// The unpacked bundle; default: the one under <root>/bundles built for the cluster.
    #[arg(long, value_name = "DIR")]
    pub bundle_dir: Option<PathBuf>,
    /// The admin kubeconfig; default: <root>/<cluster>.kubeconfig.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The installer's state root.
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub root: PathBuf,
    /// The state database that recorded the install.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    pub state: PathBuf,
    /// text: progress, then the summary; json: the summary as JSON on stdout.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Subcommand)]
pub enum EtcdCommand {
    /// Take a snapshot of the cluster's etcd through a healthy member and copy it here:
    /// <dir>/<cluster>-<UTC time>.db with its .sha256 and a .json sidecar naming the
    /// cluster, etcd's cluster ID and members; the newest --keep are kept.
    Snapshot {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Snapshots of this cluster to keep in the directory (the newest).
        #[arg(long, value_name = "N", default_value_t = kubexm_installer::ops::etcd::KEEP)]
        keep: usize,
        /// Where snapshots go. Default: <root>/clusters/<cluster>/snapshots.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Put the cluster's etcd back to a snapshot `etcd snapshot` took. Checked first, before
    /// any host is touched: its sidecar (FILE.json) names this cluster and its etcd CA, and
    /// the file's sha256 is the sidecar's (a damaged file exits 6, another cluster's 2). Then
    /// every API server and etcd member is stopped, each member restored with a new cluster
    /// token (its data before kept beside it), etcd started and waited for, the API servers
    /// started, every node waited for until Ready. Without --yes: the plan, nothing touched.
    Restore {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The snapshot file (its sidecar FILE.json beside it).
        #[arg(long, value_name = "FILE")]
        snapshot: PathBuf,
        /// Restore: what changed in the cluster since the snapshot is lost.
        #[arg(long)]
        yes: bool,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
}

#[derive(Subcommand)]
pub enum RemoveCommand {
    /// Take workers out of an installed cluster: each Node is cordoned, drained and
    /// deleted through the first control-plane node, then the host is reset. A host
    /// named --unreachable is never contacted (not drained, not reset: `status --cluster`
    /// lists it as removed, not reset, until a later `remove node` resets it). Checked
    /// against the cluster's record first; control-plane and etcd nodes exit 8 (not
    /// supported yet). Exits 7 when a drain fails, naming what blocked it.
    Node {
        /// The host(s) to remove, by name.
        #[arg(required = true, value_name = "HOST")]
        hosts: Vec<String>,
        /// The cluster's config (it may still list the hosts; the record is what counts),
        /// hosts named unreachable (never contacted), the state root.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Seconds a drain may wait for the node's pods to go.
        #[arg(long, value_name = "SECONDS", default_value_t = kubexm_installer::ops::remove::DRAIN_TIMEOUT.as_secs(),
              value_parser = clap::value_parser!(u64).range(1..=u64::from(kubexm_installer::ops::remove::MAX_DRAIN_TIMEOUT)))]
        drain_timeout: u64,
        /// Delete the pods a drain cannot evict (those a PodDisruptionBudget protects, and
        /// pods no controller recreates): they lose a replica or are gone.
        #[arg(long)]
        force_drain: bool,
        /// Print the plan and touch no host.
        #[arg(long)]
        dry_run: bool,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
}

#[derive(Subcommand)]
pub enum DeleteCommand {
    /// Reset every host the cluster's record lists (etcd data included), then forget the
    /// record: `status --cluster` no longer lists it. The admin kubeconfig goes; the PKI,
    /// etcd snapshots and conformance results stay unless --purge (their paths printed).
    /// Without --yes: the plan, and nothing touched (exit 2).
    Cluster {
        /// The cluster (metadata.name), as the state database records it.
        #[arg(value_name = "NAME")]
        name: String,
        /// Really delete.
        #[arg(long)]
        yes: bool,
        /// Remove the cluster's PKI, etcd snapshots and conformance results from this machine too.
        #[arg(long)]
        purge: bool,
        /// The cluster's config, for how to log in to its hosts (default: as the record has it).
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: Option<PathBuf>,
        /// Hosts known to be down, comma-separated: never contacted, not reset.
        #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
        unreachable: Vec<String>,
        /// The installer's state root.
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Print every certificate kubexm or kubeadm issued on the cluster's hosts (CAs, leafs,
    /// kubeconfigs' client certificates, etcd's, kubelet's, the registry's) with its expiry;
    /// exits 7 when one expires within --warn-days. Reads certificates only, never a key.
    Check {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Flag (and exit 7 for) certificates that expire within this many days.
        #[arg(long, value_name = "DAYS", default_value_t = kubexm_installer::ops::certs::WARN_DAYS)]
        warn_days: u32,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Renew the certificates that end within --within days (or all, --all): kubexm's leafs
    /// (etcd's members and client, the registry's; valid certificates.leafDays) issued anew
    /// and put in place member by member, each etcd member checked healthy with them (etcd
    /// reads them at each new connection); kubeadm's leafs renewed one control-plane node at a time, its static pods
    /// restarted and its API server waited for; then a new admin kubeconfig. Steps check
    /// the hosts first: a re-run does only what is still due.
    Renew {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Renew what ends within this many days.
        #[arg(long, value_name = "DAYS", default_value_t = kubexm_installer::ops::certs::WARN_DAYS)]
        within: u32,
        /// Renew every leaf certificate, due or not.
        #[arg(long)]
        all: bool,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
}
