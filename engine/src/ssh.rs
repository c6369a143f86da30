//! The SSH transport, on russh: password, key (with passphrase) or agent
//! authentication, an optional bastion, host keys pinned on first contact,
//! `sudo` for users other than root, and SFTP uploads checked by sha256.
//!
//! One connection per host serves every step; each command is a channel.
//! Keepalives notice a host that went away within about 30 s; from then on
//! every call fails with [`TransportError::Lost`]. A command's output is
//! kept bounded as it arrives ([`crate::output`]), and a command that
//! prints past the read ceiling has its channel closed.
//!
//! Uploads never leave a readable or predictable file behind: each goes
//! into a fresh private directory (`mktemp -d`, mode 0700, owned by the login
//! user, random name), opened exclusively with mode 0600, then installed
//! in place as root with its final mode and the directory removed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use russh::ChannelMsg;
use russh::client::{self, AuthResult, Handle};
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use tokio::io::AsyncWriteExt;

use crate::output::{Capture, READ_CEILING};
use crate::transport::{CmdOutput, Transport, TransportError, shell_quote};

/// How to log in.
#[derive(Clone)]
pub enum Credential {
    Password(String),
    Key {
        path: std::path::PathBuf,
        passphrase: Option<String>,
    },
    Agent,
    /// A private key held in memory (a server-side credential), never on disk.
    KeyData {
        pem: String,
        passphrase: Option<String>,
    },
}

impl std::fmt::Debug for Credential {
    // Never print a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Password(_) => f.write_str("Password(<redacted>)"),
            Credential::Key { path, .. } => write!(f, "Key({})", path.display()),
            Credential::Agent => f.write_str("Agent"),
            Credential::KeyData { .. } => f.write_str("KeyData(<redacted>)"),
        }
    }
}

/// Where and as whom to connect.
#[derive(Debug, Clone)]
pub struct Target {
    /// The host's name in the config (for messages and the host-key pin).
    pub name: String,
    pub address: String,
    pub port: u16,
    pub user: String,
    pub credential: Credential,
    pub bastion: Option<Box<Target>>,
    /// The host key the config gives (`hosts[].hostKey`, `TYPE BASE64`):
    /// under the operator's own config it is the pin, over one first
    /// contact made.
    pub host_key: Option<String>,
}

/// Pinned host keys, by `address:port`.
pub trait KnownHosts: Send + Sync {
    fn get(&self, endpoint: &str) -> Option<String>;
    fn put(&self, endpoint: &str, key: &str);
}

/// Host keys kept in memory (tests, one-off runs).
#[derive(Default)]
pub struct MemoryKnownHosts(Mutex<std::collections::HashMap<String, String>>);

impl KnownHosts for MemoryKnownHosts {
    fn get(&self, endpoint: &str) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(endpoint).cloned()
    }
    fn put(&self, endpoint: &str, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(endpoint.to_string(), key.to_string());
    }
}

/// An offered key as `type base64`: keys are compared without their comments.
fn key_text(offered: &PublicKeyOrCertificate) -> Result<String, russh::Error> {
    let text = match offered {
        PublicKeyOrCertificate::PublicKey { key, .. } => key.to_openssh(),
        PublicKeyOrCertificate::Certificate(c) => c.to_openssh(),
    }
    .map_err(|e| russh::Error::from(russh::keys::Error::from(e)))?;
    Ok(text.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
}

struct Client {
    endpoint: String,
    known: Arc<dyn KnownHosts>,
    accept_new: bool,
    /// Refuse a host whose key is not pinned (never pin on first contact).
    pinned_only: bool,
    changed: Arc<Mutex<Option<(String, String)>>>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(&mut self, offered: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let offered = key_text(offered)?;
        match self.known.get(&self.endpoint) {
            None if self.pinned_only => Ok(false),
            None => {
                self.known.put(&self.endpoint, &offered);
                Ok(true)
            }
            Some(k) if k == offered => Ok(true),
            Some(_) if self.accept_new => {
                self.known.put(&self.endpoint, &offered);
                Ok(true)
            }
            Some(k) => {
                *self.changed.lock().unwrap_or_else(|e| e.into_inner()) = Some((k, offered));
                Ok(false)
            }
        }
    }
}

/// A logged-in connection to one host.
pub struct Ssh {
    name: String,
    handle: Handle<Client>,
    sudo: bool,
    // A bastion connection must outlive the tunnel through it.
    _jump: Option<Box<Ssh>>,
}

/// Connects and logs in, pinning the host key in `known` on first contact
/// unless `pinned_only` (then an unpinned key is refused). The whole of it
/// (the bastion's connection, log-in and tunnel, then the host's handshake
/// and log-in) is under `timeout`: a host that accepts and then stalls
/// (a tarpit) costs no more than one that never answers.
pub async fn connect(
    target: &Target,
    known: Arc<dyn KnownHosts>,
    accept_new_key: bool,
    pinned_only: bool,
    timeout: Duration,
) -> Result<Ssh, TransportError> {
    match tokio::time::timeout(timeout, login(target, known, accept_new_key, pinned_only)).await {
        Ok(r) => r,
        Err(_) => Err(TransportError::Connect {
            host: target.name.clone(),
            address: format!("{}:{}", target.address, target.port),
            why: format!(
                "no answer within {} s (connection, SSH handshake and log-in{})",
                timeout.as_secs_f32(),
                match &target.bastion {
                    Some(b) => format!(", through bastion {}", b.name),
                    None => String::new(),
                }
            ),
        }),
    }
}

/// [`connect`] without its timeout.
fn login(
    target: &Target,
    known: Arc<dyn KnownHosts>,
    accept_new_key: bool,
    pinned_only: bool,
) -> BoxFuture<'_, Result<Ssh, TransportError>> {
    Box::pin(async move {
        let endpoint = format!("{}:{}", target.address, target.port);
        let connect_err = |why: String| TransportError::Connect {
            host: target.name.clone(),
            address: endpoint.clone(),
            why,
        };
        let changed = Arc::new(Mutex::new(None));
        let handler = Client {
            endpoint: endpoint.clone(),
            known: known.clone(),
            accept_new: accept_new_key,
            pinned_only,
            changed: changed.clone(),
        };
        let config = Arc::new(client::Config {
            inactivity_timeout: Some(Duration::from_secs(600)),
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_max: 3,
            ..Default::default()
        });
        let (handle, jump) = match &target.bastion {
            None => {
                let h = client::connect(config, (target.address.as_str(), target.port), handler).await;
                (h, None)
            }
            Some(b) => {
                let jump = login(b, known.clone(), accept_new_key, pinned_only).await?;
                let channel = jump
                    .handle
                    .channel_open_direct_tcpip(target.address.clone(), target.port as u32, "127.0.0.1", 0)
                    .await
                    .map_err(|e| connect_err(format!("through bastion {}: {e}", b.name)))?;
                let h = client::connect_stream(config, channel.into_stream(), handler).await;
                (h, Some(Box::new(jump)))
            }
        };
        let mut handle = match handle {
            Err(e) => {
                if let Some((known, offered)) = changed.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    return Err(TransportError::HostKeyChanged {
                        host: target.name.clone(),
                        known,
                        offered,
                    });
                }
                return Err(connect_err(e.to_string()));
            }
            Ok(h) => h,
        };
        let auth_err = |method: &str| TransportError::Auth {
            host: target.name.clone(),
            user: target.user.clone(),
            method: method.into(),
        };
        let ok = match &target.credential {
            Credential::Password(pw) => handle
                .authenticate_password(target.user.clone(), pw.clone())
                .await
                .map_err(|e| connect_err(e.to_string()))?,
            Credential::Key { .. } | Credential::KeyData { .. } => {
                let key = match &target.credential {
                    Credential::Key { path, passphrase } => russh::keys::load_secret_key(path, passphrase.as_deref()),
                    Credential::KeyData { pem, passphrase } => russh::keys::decode_secret_key(pem, passphrase.as_deref()),
                    _ => unreachable!("matched above"),
                }
                .map_err(|e| TransportError::Auth {
                    host: target.name.clone(),
                    user: target.user.clone(),
                    method: match &target.credential {
                        Credential::Key { path, .. } => format!("key {}: {e}", path.display()),
                        _ => format!("the credential's key: {e}"),
                    },
                })?;
                let hash = handle.best_supported_rsa_hash().await.ok().flatten().flatten();
                handle
                    .authenticate_publickey(target.user.clone(), PrivateKeyWithHashAlg::new(Arc::new(key), hash))
                    .await
                    .map_err(|e| connect_err(e.to_string()))?
            }
            Credential::Agent => {
                let mut agent = russh::keys::agent::client::AgentClient::connect_env()
                    .await
                    .map_err(|e| TransportError::Auth {
                        host: target.name.clone(),
                        user: target.user.clone(),
                        method: format!("agent (SSH_AUTH_SOCK): {e}"),
                    })?;
                let ids = agent.request_identities().await.map_err(|_| auth_err("agent"))?;
                let mut success = false;
                for id in ids {
                    if let russh::keys::agent::AgentIdentity::PublicKey { key, .. } = id {
                        let hash = handle.best_supported_rsa_hash().await.ok().flatten().flatten();
                        if let Ok(AuthResult::Success) =
                            handle.authenticate_publickey_with(target.user.clone(), key, hash, &mut agent).await
                        {
                            success = true;
                            break;
                        }
                    }
                }
                if !success {
                    return Err(auth_err("agent"));
                }
                AuthResult::Success
            }
        };
        if !matches!(ok, AuthResult::Success) {
            let method = match &target.credential {
                Credential::Password(_) => "password".to_string(),
                Credential::Key { path, .. } => format!("key {}", path.display()),
                Credential::Agent => "agent".to_string(),
                Credential::KeyData { .. } => "the credential's key".to_string(),
            };
            return Err(auth_err(&method));
        }
        Ok(Ssh {
            name: target.name.clone(),
            handle,
            sudo: target.user != "root",
            _jump: jump,
        })
    })
}

impl Ssh {
    fn session_err(&self, e: impl std::fmt::Display) -> TransportError {
        TransportError::Session {
            host: self.name.clone(),
            why: e.to_string(),
        }
    }

    /// A session error, or [`TransportError::Lost`] once the connection is gone.
    fn channel_err(&self, e: impl std::fmt::Display) -> TransportError {
        if self.handle.is_closed() {
            TransportError::Lost {
                host: self.name.clone(),
                why: e.to_string(),
            }
        } else {
            self.session_err(e)
        }
    }

    /// Runs `command` as root (through sudo for other users) or, with
    /// `as_login`, as the login user.
    async fn exec(&self, command: &str, as_login: bool) -> Result<CmdOutput, TransportError> {
        let full = if self.sudo && !as_login {
            format!("sudo -n sh -c {}", shell_quote(command))
        } else {
            command.to_string()
        };
        let mut ch = self.handle.channel_open_session().await.map_err(|e| self.channel_err(e))?;
        ch.exec(true, full).await.map_err(|e| self.channel_err(e))?;
        let mut out = CmdOutput::default();
        let (mut stdout, mut stderr) = (Capture::default(), Capture::default());
        while let Some(msg) = ch.wait().await {
            match msg {
                ChannelMsg::Data { data } => stdout.push(&data),
                ChannelMsg::ExtendedData { data, ext: 1 } => stderr.push(&data),
                ChannelMsg::ExitStatus { exit_status } => out.code = Some(exit_status),
                ChannelMsg::Close => break,
                _ => {}
            }
            if stdout.seen() + stderr.seen() > READ_CEILING {
                // Closing the channel ends the command (sshd closes its
                // pipes); nothing more of it is read.
                let _ = ch.close().await;
                return Err(TransportError::OutputLimit {
                    host: self.name.clone(),
                    command: command.chars().take(120).collect(),
                    mib: READ_CEILING >> 20,
                });
            }
        }
        if out.code.is_none() {
            // A channel that ends without a status: the command was killed,
            // or the host went away (the connection's end may trail the
            // channel's by a moment).
            for _ in 0..20 {
                if self.handle.is_closed() {
                    return Err(self.channel_err("the connection closed while a command ran"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        out.stdout = stdout.finish();
        out.stderr = stderr.finish();
        Ok(out)
    }

    /// Runs with the step timeout (as root, or as the login user).
    async fn exec_within(&self, command: &str, as_login: bool, timeout: Duration) -> Result<CmdOutput, TransportError> {
        match tokio::time::timeout(timeout, self.exec(command, as_login)).await {
            Ok(r) => r,
            Err(_) if self.handle.is_closed() => Err(self.channel_err(format!("no answer within {} s", timeout.as_secs()))),
            Err(_) => Err(TransportError::Timeout {
                host: self.name.clone(),
                command: command.chars().take(120).collect(),
                seconds: timeout.as_secs(),
            }),
        }
    }

    /// A fresh directory of the login user (`mktemp -d`, mode 0700, random
    /// name) that files cross SFTP through; the inner error says why none
    /// could be made.
    async fn private_dir(&self, what: &str) -> Result<Result<String, String>, TransportError> {
        let made = self
            .exec_within(
                &format!("umask 077 && mktemp -d \"${{TMPDIR:-/tmp}}/.kubexm-{what}.XXXXXXXXXXXX\""),
                true,
                Duration::from_secs(60),
            )
            .await?;
        let dir = made.stdout.trim().to_string();
        if !made.success() || !dir.starts_with('/') || dir.contains(['\'', '\n']) {
            return Ok(Err(format!(
                "cannot make a private {what} directory (mktemp -d): {}",
                made.stderr.trim()
            )));
        }
        Ok(Ok(dir))
    }

    /// An SFTP session over a new channel of the connection.
    async fn sftp(&self) -> Result<russh_sftp::client::SftpSession, String> {
        let ch = self.handle.channel_open_session().await.map_err(|e| e.to_string())?;
        ch.request_subsystem(true, "sftp").await.map_err(|e| e.to_string())?;
        russh_sftp::client::SftpSession::new(ch.into_stream())
            .await
            .map_err(|e| e.to_string())
    }

    /// Writes `src` to a new file at `path` (exclusive create, mode 0600);
    /// a local file goes in chunks, never whole in memory.
    async fn sftp_write(&self, src: &Source<'_>, path: &str) -> Result<(), String> {
        use russh_sftp::protocol::{FileAttributes, OpenFlags};
        use std::io::Write;
        use tokio::io::AsyncReadExt;
        let sftp = self.sftp().await?;
        let attrs = FileAttributes {
            permissions: Some(0o600),
            ..FileAttributes::empty()
        };
        let mut f = sftp
            .open_with_flags_and_attributes(path, OpenFlags::CREATE | OpenFlags::EXCLUDE | OpenFlags::WRITE, attrs)
            .await
            .map_err(|e| e.to_string())?;
        match src {
            Source::Bytes(data) => f.write_all(data).await.map_err(|e| e.to_string())?,
            Source::File { path: local, sha256 } => {
                let local_err = |e: std::io::Error| format!("reading {}: {e}", local.display());
                let mut from = tokio::fs::File::open(local).await.map_err(local_err)?;
                let mut seen = kubexm_bundle::digest::Hashing::new(std::io::sink());
                let mut buf = vec![0u8; UPLOAD_CHUNK];
                loop {
                    let n = from.read(&mut buf).await.map_err(local_err)?;
                    if n == 0 {
                        break;
                    }
                    let _ = seen.write_all(&buf[..n]);
                    f.write_all(&buf[..n]).await.map_err(|e| e.to_string())?;
                }
                let (got, _) = seen.finish();
                if got != *sha256 {
                    return Err(format!(
                        "{} changed while it was sent (sha256 {got}, expected {sha256}); it was not installed",
                        local.display()
                    ));
                }
            }
        }
        f.shutdown().await.map_err(|e| e.to_string())?;
        sftp.close().await.map_err(|e| e.to_string())
    }

    /// Puts `src` at `path` with `mode` (see the module header).
    async fn upload(&self, src: Source<'_>, path: &str, mode: u32) -> Result<(), TransportError> {
        let fail = |why: String| TransportError::Upload {
            host: self.name.clone(),
            path: path.to_string(),
            why,
        };
        let (sha, size) = match &src {
            Source::Bytes(data) => (kubexm_bundle::digest::sha256_hex(data), data.len() as u64),
            Source::File { path: local, sha256 } => (
                sha256.to_string(),
                std::fs::metadata(local)
                    .map_err(|e| fail(format!("reading {}: {e}", local.display())))?
                    .len(),
            ),
        };
        // SFTP writes as the login user, so the file lands in a private
        // directory of that user first (see the module header) and moves
        // into place as root after its digest checked out.
        let dir = self.private_dir("upload").await?.map_err(fail)?;
        let tmp = format!("{dir}/upload");
        let written = self.sftp_write(&src, &tmp).await;
        let script = format!(
            "d={d}; t=\"$d/upload\"; trap 'rm -rf \"$d\"' EXIT; [ -f \"$t\" ] || {{ echo 'the upload did not arrive' >&2; exit 1; }}; \
             test \"$(sha256sum \"$t\" | cut -d' ' -f1)\" = {sha} || {{ echo 'sha256 mismatch after upload' >&2; exit 1; }}; \
             install -D -m {mode:o} \"$t\" {p}",
            d = shell_quote(&dir),
            p = shell_quote(path)
        );
        if let Err(e) = written {
            // Remove the directory; the SFTP error is the one to report.
            let _ = self
                .exec_within(&format!("rm -rf {}", shell_quote(&dir)), false, Duration::from_secs(30))
                .await;
            return Err(if self.handle.is_closed() {
                self.channel_err(format!("SFTP: {e}"))
            } else {
                fail(format!("SFTP: {e}"))
            });
        }
        // Hashing and copying a large file (a bundle) takes its time: 120 s, and a second per 20 MiB.
        let out = self.run(&script, Duration::from_secs(120 + (size >> 20) / 20)).await?;
        if !out.success() {
            return Err(fail(out.stderr.trim().to_string()));
        }
        Ok(())
    }
}

impl Ssh {
    /// Copies the host's `path` to `local` (see [`Transport::get_file`]): as
    /// root into a private directory of the login user, whose copy SFTP
    /// reads in chunks into a temporary file beside `local`, renamed once
    /// its sha256 equals the one root computed on the host.
    async fn download(&self, path: &str, local: &std::path::Path) -> Result<String, TransportError> {
        let fail = |why: String| TransportError::Download {
            host: self.name.clone(),
            path: path.to_string(),
            why,
        };
        let dir = self.private_dir("download").await?.map_err(fail)?;
        let copy = format!(
            "set -e; d={d}; cp -- {p} \"$d/get\"; chown --reference=\"$d\" \"$d/get\"; chmod 600 \"$d/get\"; sha256sum \"$d/get\" | cut -d' ' -f1",
            d = shell_quote(&dir),
            p = shell_quote(path)
        );
        let result = async {
            let out = self.run(&copy, Duration::from_secs(600)).await?;
            if !out.success() {
                return Err(fail(out.stderr.trim().to_string()));
            }
            let want = out.stdout.trim().to_string();
            let got = self
                .sftp_read(&format!("{dir}/get"), local)
                .await
                .map_err(|e| fail(format!("SFTP: {e}")))?;
            if got != want {
                return Err(fail(format!("sha256 {got} as received, {want} on the host; nothing was kept")));
            }
            Ok(got)
        }
        .await;
        let _ = self
            .exec_within(&format!("rm -rf {}", shell_quote(&dir)), false, Duration::from_secs(30))
            .await;
        if result.is_err() {
            let _ = std::fs::remove_file(partial(local));
        }
        let got = result?;
        std::fs::rename(partial(local), local).map_err(|e| fail(format!("renaming into {}: {e}", local.display())))?;
        Ok(got)
    }

    /// Reads the host's `path` over SFTP into `local`'s temporary file; its sha256.
    async fn sftp_read(&self, path: &str, local: &std::path::Path) -> Result<String, String> {
        use std::io::Write;
        use tokio::io::AsyncReadExt;
        let sftp = self.sftp().await?;
        let mut f = sftp.open(path).await.map_err(|e| e.to_string())?;
        let tmp = partial(local);
        // A copy may hold secrets (an etcd snapshot holds every Secret): the owner's only.
        let to = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| format!("creating {}: {e}", tmp.display()))?
        };
        let mut to = kubexm_bundle::digest::Hashing::new(std::io::BufWriter::new(to));
        let mut buf = vec![0u8; UPLOAD_CHUNK];
        loop {
            let n = f.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            to.write_all(&buf[..n]).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        }
        let (sha, w) = to.finish();
        let file = w.into_inner().map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        file.sync_all().map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        sftp.close().await.map_err(|e| e.to_string())?;
        Ok(sha)
    }
}

/// Where a download is written until it is whole.
fn partial(local: &std::path::Path) -> std::path::PathBuf {
    let mut p = local.as_os_str().to_owned();
    p.push(".partial");
    p.into()
}

/// What an upload sends: bytes held in memory, or a local file read in chunks.
enum Source<'a> {
    Bytes(&'a [u8]),
    File { path: &'a std::path::Path, sha256: &'a str },
}

/// Bytes of a local file read and sent at a time.
const UPLOAD_CHUNK: usize = 256 << 10;

impl Transport for Ssh {
    fn host(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, command: &'a str, timeout: Duration) -> BoxFuture<'a, Result<CmdOutput, TransportError>> {
        Box::pin(self.exec_within(command, false, timeout))
    }

    fn going_away(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            if self.handle.is_closed() {
                return true;
            }
            // A host being powered off still answers for a moment, while
            // systemd stops services and cleans /tmp under the running step;
            // late in the shutdown systemctl no longer reaches systemd and
            // says "offline" (or nothing). A step can fail a moment before
            // the host says it is stopping: asked again shortly after, it does.
            for attempt in 0..2 {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                let going = match self
                    .exec_within("systemctl is-system-running 2>/dev/null; true", false, Duration::from_secs(5))
                    .await
                {
                    Ok(out) => matches!(out.stdout.trim(), "stopping" | "offline" | "") || self.handle.is_closed(),
                    // A step just failed and the host cannot run `systemctl`
                    // either: its sshd is going down with it.
                    Err(_) => true,
                };
                if going {
                    return true;
                }
            }
            false
        })
    }

    fn put<'a>(&'a self, data: &'a [u8], path: &'a str, mode: u32) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.upload(Source::Bytes(data), path, mode))
    }

    fn get_file<'a>(&'a self, path: &'a str, local: &'a std::path::Path) -> BoxFuture<'a, Result<String, TransportError>> {
        Box::pin(self.download(path, local))
    }

    fn put_file<'a>(
        &'a self,
        local: &'a std::path::Path,
        sha256: &'a str,
        path: &'a str,
        mode: u32,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.upload(Source::File { path: local, sha256 }, path, mode))
    }
}

/// Records the key a server offers and goes no further.
struct Scanner(Arc<Mutex<Option<String>>>);

impl client::Handler for Scanner {
    type Error = russh::Error;

    async fn check_server_key(&mut self, offered: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(key_text(offered)?);
        Ok(false)
    }
}

/// The host key `address:port` offers (`type base64`), read without
/// logging in, for an operator to check and pin.
pub async fn scan(address: &str, port: u16, timeout: Duration) -> Result<String, TransportError> {
    let seen = Arc::new(Mutex::new(None));
    let config = Arc::new(client::Config::default());
    let r = tokio::time::timeout(timeout, client::connect(config, (address, port), Scanner(seen.clone()))).await;
    let err = |why: String| TransportError::Connect {
        host: address.into(),
        address: format!("{address}:{port}"),
        why,
    };
    if let Some(k) = seen.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Ok(k);
    }
    match r {
        Err(_) => Err(err(format!("no answer within {} s", timeout.as_secs()))),
        Ok(Err(e)) => Err(err(e.to_string())),
        Ok(Ok(_)) => Err(err("the server offered no host key".into())),
    }
}
