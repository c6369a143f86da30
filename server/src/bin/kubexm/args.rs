//! The `kubexm` command's flags: every subcommand and its arguments, parsed
//! by clap; `main.rs` turns them into one job operation.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kubexm_server::jobdb::JOBS_DB;
use kubexm_server::{api, bundles, worker};

/// Clusters as jobs: `create cluster` stores a validated request as a job; a
/// worker runs it with the same operations and engine as kubexm-install,
/// writing its current step and log lines into the job database.
#[derive(Parser)]
#[command(
    name = "kubexm",
    version,
    after_help = "Exit codes: 0 ok, 1 bug, 2 usage, 3 invalid config, 4 file I/O, 5 fetch, 6 verification, 7 host or failed job, 8 not supported yet, 130 interrupted."
)]
pub(crate) struct Cli {
    /// The job database: a SQLite file, or PostgreSQL as postgres://user@host[:port]/db
    /// (workers on several machines; a password belongs in ~/.pgpass or PGPASSWORD, not here).
    #[arg(long, global = true, value_name = "FILE", default_value = JOBS_DB)]
    pub(crate) db: PathBuf,
    /// The client config (server, its CA, credentials). When it exists, create, get and
    /// cancel go to that API server instead of the local job database.
    /// [default: $KUBEXM_CONFIG, else /etc/kubexm/client.yaml if it exists]
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The key that seals and opens the database's credentials (a 0600 file, one copy
    /// beside each worker, never in the database). [default: credential.key beside a
    /// SQLite database, /var/lib/kubexm/credential.key for PostgreSQL]
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) credential_key: Option<PathBuf>,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Store a job (create cluster: an install; a re-run of an existing cluster applies only what is missing).
    Create {
        #[command(subcommand)]
        what: Create,
    },
    /// Show a job (status, current step, times, log) or the jobs.
    Get {
        #[command(subcommand)]
        what: Get,
    },
    /// Store an apply job: the installed cluster changed to what cluster.yaml now says
    /// (workers, control-plane nodes and etcd members added), from the bundle it was installed from.
    Scale(CreateCluster),
    /// Store an upgrade job: the installed cluster to the Kubernetes version cluster.yaml now
    /// names, from the bundle built for it (one hop: a minor, or a patch release).
    Upgrade {
        #[command(subcommand)]
        what: UpgradeCmd,
    },
    /// Store a reset job (runs like any other job).
    Reset {
        #[command(subcommand)]
        what: ResetCmd,
    },
    /// Store a delete job: every host of the cluster reset, its record forgotten.
    Delete {
        #[command(subcommand)]
        what: DeleteCmd,
    },
    /// Store a job taking hosts out of an installed cluster (runs like any other job).
    Remove {
        #[command(subcommand)]
        what: RemoveCmd,
    },
    /// Store a restore job: the cluster's etcd put back to one of its snapshots.
    Restore {
        #[command(subcommand)]
        what: RestoreCmd,
    },
    /// Cancel a job: one waiting ends at once; a running one starts no new step.
    Cancel {
        #[command(subcommand)]
        what: Cancel,
    },
    /// Claim and run jobs from the job database until stopped.
    Worker(WorkerArgs),
    /// The HTTPS API for automation, with an embedded worker.
    ApiServer(ApiServerArgs),
    /// Operator mode's controller: reconciles the Cluster objects of kubexm-system
    /// (one leader among the replicas, through a Lease); runs inside the cluster,
    /// or beside it with --kubeconfig.
    ControllerManager(ControllerManagerArgs),
    /// Bearer tokens for the API.
    Token {
        #[command(subcommand)]
        what: TokenCmd,
    },
    /// Client certificates from the API server's CA.
    ClientCert {
        #[command(subcommand)]
        what: ClientCertCmd,
    },
    /// Bundles held by digest (API jobs name one).
    Bundle {
        #[command(subcommand)]
        what: BundleCmd,
    },
    /// Named SSH credentials a request's hosts log in with (`auth: {credential: NAME}`).
    Credential {
        #[command(subcommand)]
        what: CredentialCmd,
    },
    /// Host keys pinned by an operator: a request's job connects to no other host.
    HostKey {
        #[command(subcommand)]
        what: HostKeyCmd,
    },
}

#[derive(Subcommand)]
pub(crate) enum CredentialCmd {
    /// Seal a private key or password under the credential key and store it by name.
    #[command(group = clap::ArgGroup::new("secret").required(true).args(["ssh_key", "password_from_file"]))]
    Create {
        /// 1 to 63 lowercase letters, digits and '-'.
        name: String,
        /// A private key file (OpenSSH or PEM).
        #[arg(long, value_name = "FILE")]
        ssh_key: Option<PathBuf>,
        /// A file holding the key's passphrase.
        #[arg(long, value_name = "FILE", requires = "ssh_key")]
        passphrase_from_file: Option<PathBuf>,
        /// A file holding the password (never the command line).
        #[arg(long, value_name = "FILE")]
        password_from_file: Option<PathBuf>,
        /// Where it may be offered: CIDRs, addresses or host names, comma-separated.
        #[arg(long, value_name = "CIDR,...", value_delimiter = ',', required = true)]
        hosts: Vec<String>,
    },
    /// The credentials, without their secrets.
    List {
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
    },
    /// Forget a credential.
    Delete { name: String },
}

#[derive(Subcommand)]
pub(crate) enum HostKeyCmd {
    /// Pin a host's key: `kubexm host-key add 10.0.0.5 'ssh-ed25519 AAAA...'`.
    Add {
        /// ADDRESS[:PORT] (port 22 unless given).
        endpoint: String,
        /// The key, as in known_hosts or the host's /etc/ssh/ssh_host_*_key.pub.
        key: String,
    },
    /// Show the key a host offers now; pinned only with --yes, once you have checked it.
    Scan {
        /// ADDRESS[:PORT] (port 22 unless given).
        endpoint: String,
        /// Pin the key shown (check it against the host's console first).
        #[arg(long)]
        yes: bool,
    },
    /// The pinned keys.
    List {
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
    },
    /// Unpin a host's key.
    Delete { endpoint: String },
}

#[derive(Subcommand)]
pub(crate) enum TokenCmd {
    /// Make a token (printed once; only its sha256 is stored in the job database).
    Create {
        /// Who or what it is for (shown in the job database, never secret).
        #[arg(long, default_value = "default")]
        name: String,
        /// What it may do: read, create, reset, credential, host-key, admin (comma-separated).
        #[arg(long, value_name = "SCOPES", default_value = "read,create")]
        scopes: String,
        /// How long it is valid: 90m, 12h, 30d (none: until revoked).
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
    },
    /// The tokens: id, name, scopes, expiry, revocation (never their values).
    List {
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
    },
    /// Revoke a token by id or name: refused from the next request on.
    Revoke { token: String },
}

#[derive(Subcommand)]
pub(crate) enum ClientCertCmd {
    /// Sign a client certificate `<out>/<name>.crt` (and key) with the API server's CA.
    Create {
        name: String,
        #[arg(long, value_name = "DIR", default_value = ".")]
        out: PathBuf,
        /// The API server's TLS directory (its CA).
        #[arg(long, value_name = "DIR", default_value = api::tls::TLS_DIR)]
        tls_dir: PathBuf,
        /// What it may do (in its subject): read, create, reset, credential, host-key, admin.
        #[arg(long, value_name = "SCOPES", default_value = "read,create")]
        scopes: String,
        /// Days it is valid.
        #[arg(long, value_name = "N", default_value_t = 365)]
        days: i64,
    },
    /// Revoke a client certificate (its .crt file): refused from the next request on.
    Revoke { cert: PathBuf },
}

#[derive(Subcommand)]
pub(crate) enum BundleCmd {
    /// Check a bundle's signature and hold it by digest (prints the digest).
    Add {
        file: PathBuf,
        /// The bundle's minisign public key.
        #[arg(long, value_name = "FILE")]
        pubkey: PathBuf,
        #[arg(long, value_name = "DIR", default_value = bundles::BUNDLES_DIR)]
        bundles: PathBuf,
    },
    /// The digests of the bundles held.
    List {
        #[arg(long, value_name = "DIR", default_value = bundles::BUNDLES_DIR)]
        bundles: PathBuf,
    },
}

#[derive(Args)]
pub(crate) struct ApiServerArgs {
    /// Address and port to listen on.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:8443")]
    pub(crate) listen: std::net::SocketAddr,
    /// Its CA (generated on first start, or yours as ca.crt and ca.key), certificate and key.
    #[arg(long, value_name = "DIR", default_value = api::tls::TLS_DIR)]
    pub(crate) tls_dir: PathBuf,
    /// A name or address clients reach the server by (repeatable); the host name,
    /// localhost, 127.0.0.1 and the listen address are always covered.
    #[arg(long, value_name = "NAME")]
    pub(crate) san: Vec<String>,
    /// Run no embedded worker (workers run elsewhere, sharing the job database).
    #[arg(long)]
    pub(crate) no_worker: bool,
    /// Connections open at once; one more is closed at once (idle ones close after 10 s).
    #[arg(long, value_name = "N", default_value_t = api::limits::MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// Also serve /healthz and /readyz over plain HTTP here (loopback), outside the connection cap.
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) health_listen: Option<std::net::SocketAddr>,
    /// Mutating requests (POST) a token or certificate may make per minute, after a burst of 20 (0: no limit).
    #[arg(long, value_name = "N", default_value_t = api::POST_RATE)]
    pub(crate) post_rate: u32,
    /// Days finished jobs and their logs are kept (0: for ever).
    #[arg(long, value_name = "DAYS", default_value_t = worker::RETAIN_DAYS)]
    pub(crate) retain_days: u64,
    #[command(flatten)]
    pub(crate) install: InstallFlags,
    /// The engine's state database of the embedded worker.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    pub(crate) state: PathBuf,
    /// Seconds a claim holds without renewal before another worker may take the job.
    #[arg(long, default_value_t = 30)]
    pub(crate) lease_seconds: u64,
}

/// The install's options a worker applies to API jobs.
#[derive(Args)]
pub(crate) struct InstallFlags {
    /// The bundles jobs name by digest (`kubexm bundle add`).
    #[arg(long, value_name = "DIR", default_value = bundles::BUNDLES_DIR)]
    pub(crate) bundles: PathBuf,
    /// The address hosts reach the worker's machine at (its file server).
    #[arg(long, value_name = "ADDR")]
    pub(crate) advertise: Option<std::net::IpAddr>,
    /// The bundles' minisign public key.
    #[arg(long, value_name = "FILE")]
    pub(crate) pubkey: Option<PathBuf>,
    /// Port of the file server the worker runs during the install.
    #[arg(long, default_value_t = kubexm_installer::SERVE_PORT)]
    pub(crate) serve_port: u16,
    /// The installer's state root on the worker's machine (unpacked bundles, PKI).
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub(crate) root: PathBuf,
}

#[derive(Subcommand)]
pub(crate) enum Create {
    /// A cluster from cluster.yaml and a bundle: validated, stored, run.
    Cluster(CreateCluster),
    /// A facts job: every host of cluster.yaml asked for its OS, arch, kernel, ports, leftovers.
    Facts(HostsJob),
    /// An etcd snapshot job: a snapshot of the cluster's etcd through a healthy member,
    /// kept with its sha256 and sidecar under the worker's --root (clusters/<name>/snapshots).
    EtcdSnapshot(EtcdSnapshotJob),
    /// A certificate check job: every certificate on the hosts with its expiry; the job
    /// fails when one expires within --warn-days.
    CertsCheck(CertsCheckJob),
    /// A certificate renewal job: what ends within --within days (or all, --all) renewed,
    /// etcd members and control-plane nodes one at a time, each waited for; a re-run does
    /// only what is still due.
    CertsRenew(CertsRenewJob),
}

#[derive(Args)]
pub(crate) struct CertsRenewJob {
    #[command(flatten)]
    pub(crate) job: HostsJob,
    /// Renew what ends within this many days. Default: 30.
    #[arg(long, value_name = "DAYS")]
    pub(crate) within: Option<u32>,
    /// Renew every leaf certificate, due or not.
    #[arg(long)]
    pub(crate) all: bool,
    /// The state root of a job run here: the cluster's PKI is <root>/clusters/<name>/pki.
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub(crate) root: PathBuf,
}

#[derive(Args)]
pub(crate) struct CertsCheckJob {
    #[command(flatten)]
    pub(crate) job: HostsJob,
    /// Fail the job when a certificate expires within this many days. Default: 30.
    #[arg(long, value_name = "DAYS")]
    pub(crate) warn_days: Option<u32>,
}

#[derive(Args)]
pub(crate) struct EtcdSnapshotJob {
    #[command(flatten)]
    pub(crate) job: HostsJob,
    /// Snapshots of the cluster kept (the newest). Default: 5.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) keep: Option<u32>,
    /// The state root of a job run here: snapshots go under <root>/clusters/<name>/snapshots.
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub(crate) root: PathBuf,
}

/// A job that only reaches the config's hosts (no bundle).
#[derive(Args)]
pub(crate) struct HostsJob {
    /// cluster.yaml.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// Store the job and return: a running `kubexm worker` runs it.
    #[arg(long)]
    pub(crate) detach: bool,
    /// The engine's state database, for a job run here.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    pub(crate) state: PathBuf,
    /// Hosts known to be down, comma-separated: never contacted, left out of the job.
    #[arg(long, value_delimiter = ',', value_name = "HOSTS")]
    pub(crate) unreachable: Vec<String>,
}

#[derive(Subcommand)]
pub(crate) enum DeleteCmd {
    /// Reset every host the cluster's record lists (etcd data included) and forget the
    /// record, as `kubexm-install delete cluster`; PKI and snapshots under the worker's root
    /// stay unless --purge.
    Cluster {
        #[command(flatten)]
        job: HostsJob,
        /// Confirm: without it nothing is stored.
        #[arg(long)]
        yes: bool,
        /// Remove the cluster's PKI, etcd snapshots and conformance results under the worker's root.
        #[arg(long)]
        purge: bool,
        /// The installer's state root on the worker's machine (with an API server: its `--root`).
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum RemoveCmd {
    /// Take workers out: each Node cordoned, drained and deleted, each host reset; a host
    /// named --unreachable is not contacted (removed, not reset). As `kubexm-install remove
    /// node`, checked against the cluster's record by the worker.
    Node {
        /// The host(s) to remove (hosts of cluster.yaml).
        #[arg(required = true, value_name = "HOST")]
        hosts: Vec<String>,
        #[command(flatten)]
        job: HostsJob,
        /// Seconds a drain may wait for the node's pods to go. Default: 300.
        #[arg(long, value_name = "SECONDS",
              value_parser = clap::value_parser!(u32).range(1..=i64::from(kubexm_installer::ops::remove::MAX_DRAIN_TIMEOUT)))]
        drain_timeout: Option<u32>,
        /// Delete the pods a drain cannot evict (a PodDisruptionBudget's, pods without a controller).
        #[arg(long)]
        force_drain: bool,
        /// The installer's state root on the worker's machine (with an API server: its `--root`).
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum RestoreCmd {
    /// Put etcd back to a snapshot of the cluster, named by its file name under the worker's
    /// <root>/clusters/<name>/snapshots (as `kubexm create etcd-snapshot` kept it). As
    /// `kubexm-install etcd restore`: checked first (sidecar, cluster, CA, sha256), then every
    /// API server and member stopped, each member restored, all started and waited for.
    Etcd {
        #[command(flatten)]
        job: HostsJob,
        /// The snapshot's file name (`<cluster>-<stamp>.db`).
        #[arg(long, value_name = "NAME")]
        snapshot: String,
        /// Confirm: what changed since the snapshot is lost. Without it nothing is stored.
        #[arg(long)]
        yes: bool,
        /// The installer's state root on the worker's machine (with an API server: its `--root`).
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum ResetCmd {
    /// Stop and remove what kubexm installed on every host of cluster.yaml, etcd data included.
    Cluster {
        #[command(flatten)]
        job: HostsJob,
        /// Confirm: without it nothing is stored.
        #[arg(long)]
        yes: bool,
        /// The installer's state root on the worker's machine (with an API server: its `--root`).
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
    },
}

#[derive(Args)]
pub(crate) struct CreateCluster {
    /// cluster.yaml.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// The bundle: a file, or the digest of one held (`kubexm bundle list`; the only
    /// form an API server takes).
    #[arg(long, value_name = "DIGEST_OR_FILE")]
    pub(crate) bundle: String,
    /// Where bundles named by digest are held.
    #[arg(long, value_name = "DIR", default_value = bundles::BUNDLES_DIR)]
    pub(crate) bundles: PathBuf,
    /// The bundle's minisign public key.
    #[arg(long, value_name = "FILE")]
    pub(crate) pubkey: Option<PathBuf>,
    /// Accept a bundle without checking a signature (warns loudly).
    #[arg(long)]
    pub(crate) allow_unsigned: bool,
    /// The address hosts reach the worker's machine at (its file server).
    #[arg(long, value_name = "ADDR")]
    pub(crate) advertise: Option<std::net::IpAddr>,
    /// Port of the file server the worker runs during the install.
    #[arg(long, default_value_t = kubexm_installer::SERVE_PORT)]
    pub(crate) serve_port: u16,
    /// The installer's state root on the worker's machine (unpacked bundles, PKI).
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    pub(crate) root: PathBuf,
    /// Phases to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub(crate) phases: Vec<String>,
    /// Where the worker writes the admin kubeconfig. Default: <root>/<cluster>.kubeconfig.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Store the job and return: a running `kubexm worker` runs it. Without it, and with
    /// no worker running, the job runs here in the foreground (Ctrl-C leaves it resumable).
    #[arg(long)]
    pub(crate) detach: bool,
    /// The engine's state database, for a job run here.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    pub(crate) state: PathBuf,
}

#[derive(Subcommand)]
pub(crate) enum UpgradeCmd {
    /// The cluster of cluster.yaml, to the version it names.
    Cluster(UpgradeCluster),
}

#[derive(Args)]
pub(crate) struct UpgradeCluster {
    #[command(flatten)]
    pub(crate) create: CreateCluster,
    /// A NotReady worker to leave at its version (said in the job's log; repeatable).
    #[arg(long = "skip-not-ready", value_name = "HOST")]
    pub(crate) skip_not_ready: Vec<String>,
    /// Each drain's time limit (default: the config's spec.upgrade.drainTimeoutSeconds).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub(crate) drain_timeout: Option<u32>,
}

#[derive(Subcommand)]
pub(crate) enum Get {
    /// One job: status, current step, times and log.
    Job {
        id: i64,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
        /// Stream the log until the job ends (each line once, in order).
        #[arg(long)]
        follow: bool,
        /// With --follow: start after this log sequence number (resume a stream).
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        from: i64,
        /// Write where the job's time went to FILE instead: an SVG (a lane
        /// per host, a bar per step coloured by phase, waits hatched, the
        /// critical path outlined), or with -o json the same data as JSON.
        #[arg(long, value_name = "FILE", conflicts_with = "follow")]
        timeline: Option<PathBuf>,
    },
    /// Every job, newest first.
    Jobs {
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
    },
}

#[derive(Subcommand)]
pub(crate) enum Cancel {
    Job { id: i64 },
}

#[derive(Args)]
pub(crate) struct ControllerManagerArgs {
    /// The kubeconfig to reach the API server with. [default: the pod's service account]
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The namespace of the Cluster objects, the Lease and the applied specs.
    #[arg(long, default_value = kubexm_operator::NAMESPACE)]
    pub(crate) namespace: String,
    /// This replica's name in the Lease. [default: $POD_NAME, else the host name and pid]
    #[arg(long)]
    pub(crate) identity: Option<String>,
    /// The Lease the replicas elect their leader with.
    #[arg(long, default_value = kubexm_operator::LEASE)]
    pub(crate) lease_name: String,
    /// Seconds a leader that stopped renewing keeps the Lease (another replica then takes it).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=300))]
    pub(crate) lease_seconds: u64,
    /// Run the changes it decides (hosts added or taken out) from this
    /// installer state root: the bundle the cluster's record names, unpacked
    /// by its install. Without it, changes are decided and reported only.
    #[arg(long, value_name = "DIR", requires = "state")]
    pub(crate) root: Option<PathBuf>,
    /// The installer's state database of the cluster (steps done, pinned host keys).
    #[arg(long, value_name = "FILE", requires = "root")]
    pub(crate) state: Option<PathBuf>,
    /// The address the hosts reach this machine at, for a file server of its own during a
    /// change it runs (needed with registry.clientAuth). Without it, the hosts fetch the
    /// bundle's files from the registry host's kubexm-registry.
    #[arg(long, value_name = "ADDR", requires = "root")]
    pub(crate) advertise: Option<std::net::IpAddr>,
    /// The own file server's port (with --advertise).
    #[arg(long, value_name = "PORT", default_value_t = kubexm_installer::SERVE_PORT)]
    pub(crate) serve_port: u16,
    /// Hosts a change it runs works on at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(crate) concurrency: u64,
}

#[derive(Args)]
pub(crate) struct WorkerArgs {
    /// The engine's state database (step results, pinned host keys).
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    pub(crate) state: PathBuf,
    /// Run at most one job, or none if none is waiting, then exit.
    #[arg(long)]
    pub(crate) once: bool,
    /// Seconds a claim holds without renewal before another worker may take the job.
    #[arg(long, default_value_t = 30)]
    pub(crate) lease_seconds: u64,
    /// Days finished jobs and their logs are kept (0: for ever).
    #[arg(long, value_name = "DAYS", default_value_t = worker::RETAIN_DAYS)]
    pub(crate) retain_days: u64,
    #[command(flatten)]
    pub(crate) install: InstallFlags,
}

/// `--retain-days` as the worker's setting.
pub(crate) fn retention(days: u64) -> Option<std::time::Duration> {
    (days > 0).then(|| std::time::Duration::from_secs(days * 86_400))
}

impl InstallFlags {
    /// The options this machine's worker applies to API install jobs.
    pub(crate) fn worker(self) -> worker::WorkerInstall {
        if self.advertise.is_some() && self.pubkey.is_none() {
            eprintln!(
                "WARNING: no --pubkey: the bundles of API jobs are installed without a signature check (`kubexm bundle add` checked it)"
            );
        }
        worker::WorkerInstall {
            bundles: self.bundles,
            advertise: self.advertise,
            pubkey: self.pubkey,
            serve_port: self.serve_port,
            root: self.root,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
    Yaml,
}
