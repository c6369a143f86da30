//! Named credentials: the only way a request's hosts log in. An operator
//! makes one on a machine holding the credential key (`kubexm credential
//! create NAME --ssh-key FILE --hosts CIDR,...`); it is sealed with
//! AES-256-GCM under that key (its name as associated data, so a sealed
//! secret cannot be moved to another name) and stored in the job database.
//! The key lives in a 0600 file beside each worker, never in the database:
//! the database alone opens nothing. A worker opens a credential only for a
//! host whose address is inside its allow-list.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use kubexm_bom::net::Cidr;
use kubexm_engine::ssh::{Credential, KnownHosts, MemoryKnownHosts};
use kubexm_engine::trust::{Credentials, Trust};
use serde::{Deserialize, Serialize};

use crate::jobdb::{CredentialKind, CredentialRow, JobDb};

/// Where the credential key lives unless told otherwise.
pub const CREDENTIAL_KEY: &str = "/var/lib/kubexm/credential.key";

/// A credential's secret, as sealed.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
enum Secret {
    Password { password: String },
    SshKey { pem: String, passphrase: Option<String> },
}

/// The credential key: 32 random bytes, hex, in a file of mode 0600.
pub struct SealKey([u8; 32]);

impl SealKey {
    /// Reads the key at `path`, refusing one others may read.
    pub fn load(path: &Path) -> anyhow::Result<SealKey> {
        let meta = fs_err::metadata(path).map_err(|e| {
            anyhow::anyhow!(
                "{e}; the credential key is made by `kubexm credential create` and copied (mode 0600) to every worker's machine"
            )
        })?;
        if meta.permissions().mode() & 0o077 != 0 {
            anyhow::bail!(
                "{} is readable by others (mode {:o}): whoever reads it opens every credential; chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
        let text = fs_err::read_to_string(path)?;
        let bytes = hex::decode(text.trim()).map_err(|e| anyhow::anyhow!("{}: not a credential key ({e})", path.display()))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|_| anyhow::anyhow!("{}: a credential key is 32 bytes (64 hex digits)", path.display()))?;
        Ok(SealKey(key))
    }

    /// The key at `path`, made (0600, atomically) if there is none.
    pub fn load_or_create(path: &Path) -> anyhow::Result<SealKey> {
        if !path.exists() {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            fs_err::create_dir_all(dir)?;
            let bytes = kubexm_installer::kube_pki::random_bytes(32)?;
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            std::io::Write::write_all(&mut tmp, format!("{}\n", hex::encode(&bytes)).as_bytes())?;
            tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o600))?;
            // Never replace a key another process made meanwhile.
            tmp.persist_noclobber(path)
                .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.error))?;
        }
        SealKey::load(path)
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte AES-256 key"))
    }

    fn seal(&self, name: &str, secret: &Secret) -> anyhow::Result<String> {
        let nonce_bytes: [u8; NONCE_LEN] = kubexm_installer::kube_pki::random_bytes(NONCE_LEN)?
            .try_into()
            .map_err(|_| anyhow::anyhow!("short read of /dev/urandom"))?;
        let mut data = serde_json::to_vec(secret)?;
        self.aead()
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce_bytes), Aad::from(name.as_bytes()), &mut data)
            .map_err(|_| anyhow::anyhow!("sealing credential {name} failed"))?;
        Ok(format!("v1:{}:{}", hex::encode(nonce_bytes), hex::encode(data)))
    }

    fn open(&self, name: &str, sealed: &str) -> Result<Secret, String> {
        let bad = || {
            format!("credential {name} cannot be opened with this worker's credential key (another key sealed it, or the row was altered)")
        };
        let mut parts = sealed.splitn(3, ':');
        let (Some("v1"), Some(nonce), Some(data)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let nonce: [u8; NONCE_LEN] = hex::decode(nonce).ok().and_then(|n| n.try_into().ok()).ok_or_else(bad)?;
        let mut data = hex::decode(data).map_err(|_| bad())?;
        let plain = self
            .aead()
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(name.as_bytes()), &mut data)
            .map_err(|_| bad())?;
        serde_json::from_slice(plain).map_err(|_| bad())
    }
}

/// What `kubexm credential create` was given.
pub enum NewSecret {
    /// A private key file, and its passphrase's file.
    SshKey { key: PathBuf, passphrase: Option<PathBuf> },
    /// A file holding the password (never the command line).
    Password { file: PathBuf },
}

/// Checks an allow-list entry: a CIDR, an address, or an exact host name.
fn allowed_entry(h: &str) -> anyhow::Result<()> {
    if Cidr::parse(h).is_some() || h.parse::<IpAddr>().is_ok() || kubexm_bom::net::is_host_address(h) {
        Ok(())
    } else {
        anyhow::bail!("--hosts: `{h}` is neither a CIDR, an address nor a host name")
    }
}

/// Whether `address` is inside the allow-list `hosts`.
fn allows(hosts: &[String], address: &str) -> bool {
    let ip = address.parse::<IpAddr>().ok();
    hosts.iter().any(|h| match (Cidr::parse(h), ip, h.parse::<IpAddr>().ok()) {
        (Some(c), Some(ip), _) => c.contains(ip),
        (_, Some(ip), Some(one)) => ip == one,
        _ => h.eq_ignore_ascii_case(address),
    })
}

/// `kubexm credential create`: reads the secret from its file, seals it and
/// stores it as `name`, to be offered only to `hosts`.
pub async fn create(db: &JobDb, key: &SealKey, name: &str, secret: NewSecret, hosts: &[String]) -> anyhow::Result<CredentialKind> {
    if !kubexm_bom::net::is_dns_label(name) {
        anyhow::bail!("credential name `{name}`: use 1 to 63 lowercase letters, digits and '-'");
    }
    if hosts.is_empty() {
        anyhow::bail!("--hosts: name the CIDRs this credential may be offered to (it is never offered elsewhere)");
    }
    for h in hosts {
        allowed_entry(h)?;
    }
    let trimmed = |p: &Path| -> anyhow::Result<String> { Ok(fs_err::read_to_string(p)?.trim_end_matches(['\n', '\r']).to_string()) };
    let (kind, secret) = match secret {
        NewSecret::Password { file } => (CredentialKind::Password, Secret::Password { password: trimmed(&file)? }),
        NewSecret::SshKey { key: file, passphrase } => {
            let pem = fs_err::read_to_string(&file)?;
            let passphrase = passphrase.as_deref().map(trimmed).transpose()?;
            russh::keys::decode_secret_key(&pem, passphrase.as_deref())
                .map_err(|e| anyhow::anyhow!("{}: not a private key this passphrase opens: {e}", file.display()))?;
            (CredentialKind::SshKey, Secret::SshKey { pem, passphrase })
        }
    };
    db.put_credential(name, kind, hosts, &key.seal(name, &secret)?).await?;
    Ok(kind)
}

/// A request's credentials, as the job database held them when its run
/// started, opened on the worker. The engine asks for them synchronously
/// from its own threads: they are read (async) before the run, not during it.
pub struct DbCredentials {
    /// The credentials by name, or why they could not be read.
    rows: Result<HashMap<String, CredentialRow>, String>,
    /// The key, or why this worker has none.
    key: Result<SealKey, String>,
}

impl Credentials for DbCredentials {
    fn resolve(&self, name: &str, host: &str, address: &str) -> Result<Credential, String> {
        let row = self
            .rows
            .as_ref()
            .map_err(Clone::clone)?
            .get(name)
            .ok_or_else(|| format!("no credential named {name:?} (`kubexm credential list` shows them)"))?;
        if !allows(&row.hosts, address) {
            return Err(format!(
                "credential {name:?} may not be offered to {address}: its allow-list is {} (`kubexm credential create {name} ... --hosts` sets it)",
                row.hosts.join(",")
            ));
        }
        let key = self
            .key
            .as_ref()
            .map_err(|why| format!("host {host}: this worker cannot open credential {name:?}: {why}"))?;
        Ok(match key.open(name, &row.sealed)? {
            Secret::Password { password } => Credential::Password(password),
            Secret::SshKey { pem, passphrase } => Credential::KeyData { pem, passphrase },
        })
    }
}

/// The pinned host keys, as the job database held them when the run
/// started; never pins one.
struct DbPins(MemoryKnownHosts);

impl KnownHosts for DbPins {
    fn get(&self, endpoint: &str) -> Option<String> {
        self.0.get(endpoint)
    }
    fn put(&self, _endpoint: &str, _key: &str) {}
}

/// What a request's run may use: the database's credentials (opened with
/// the key at `key_path`, if this worker has it) and pinned host keys, read
/// now for the run.
pub async fn untrusted(db: &JobDb, key_path: &Path) -> Trust {
    let rows = db
        .credentials()
        .await
        .map(|rows| rows.into_iter().map(|r| (r.name.clone(), r)).collect())
        .map_err(|e| e.to_string());
    let pins = MemoryKnownHosts::default();
    match db.host_keys().await {
        Ok(keys) => keys.iter().for_each(|k| pins.put(&k.endpoint, &k.key)),
        // No pin read: no host is connected to, each saying it has none.
        Err(e) => tracing::warn!("reading the pinned host keys: {e}"),
    }
    Trust::Untrusted {
        credentials: Arc::new(DbCredentials {
            rows,
            key: SealKey::load(key_path).map_err(|e| format!("{}: {e:#}", key_path.display())),
        }),
        pinned: Arc::new(DbPins(pins)),
    }
}

/// A host key as pinned: `type base64`, checked to parse, comment dropped.
pub fn normalize_host_key(key: &str) -> anyhow::Result<String> {
    let k = russh::keys::PublicKey::from_openssh(key.trim())
        .map_err(|e| anyhow::anyhow!("not an OpenSSH public key (`ssh-ed25519 AAAA...`): {e}"))?;
    let text = k.to_openssh().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(text.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
}

/// `address[:port]` as pinned (`address:22` when no port is given).
pub fn endpoint(given: &str) -> anyhow::Result<String> {
    let (addr, port) = match given.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') || a.starts_with('[') => (a.trim_matches(['[', ']']), p.parse::<u16>()?),
        _ => (given, 22),
    };
    if !kubexm_bom::net::is_host_address(addr) {
        anyhow::bail!("`{given}` is not ADDRESS[:PORT]");
    }
    Ok(format!("{addr}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_match_cidrs_addresses_and_exact_names() {
        let l = vec!["198.18.0.0/24".to_string(), "10.0.0.5".into(), "node-a".into()];
        assert!(allows(&l, "198.18.0.7") && allows(&l, "10.0.0.5") && allows(&l, "node-a"));
        assert!(!allows(&l, "198.18.1.7") && !allows(&l, "10.0.0.6") && !allows(&l, "node-b"));
    }

    #[test]
    fn a_sealed_secret_opens_only_under_its_name_and_key() {
        let k = SealKey([7; 32]);
        let s = k.seal("a", &Secret::Password { password: "pw".into() }).unwrap();
        assert!(!s.contains("pw"));
        assert!(matches!(k.open("a", &s), Ok(Secret::Password { password }) if password == "pw"));
        assert!(k.open("b", &s).is_err());
        assert!(SealKey([8; 32]).open("a", &s).is_err());
    }

    #[test]
    fn endpoints_default_to_port_22() {
        assert_eq!(endpoint("198.18.0.2").unwrap(), "198.18.0.2:22");
        assert_eq!(endpoint("198.18.0.2:2222").unwrap(), "198.18.0.2:2222");
        assert!(endpoint("a b").is_err());
    }
}
