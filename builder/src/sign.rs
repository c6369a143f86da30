//! minisign keys and signatures, compatible with the `minisign` CLI.
//!
//! A secret key is encrypted with a password unless `--no-password` asks
//! otherwise (for automation, with a warning). The password comes from
//! `KUBEXM_KEY_PASSWORD` or, on a terminal, a prompt; it is never logged.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The environment variable holding the secret key's password.
pub const PASSWORD_ENV: &str = "KUBEXM_KEY_PASSWORD";

/// `k.tar.zst` → `k.tar.zst.minisig`.
pub fn signature_path(bundle: &Path) -> PathBuf {
    let mut s = bundle.as_os_str().to_owned();
    s.push(".minisig");
    PathBuf::from(s)
}

/// Writes a new key pair. Refuses to overwrite either file unless `force`.
pub fn keygen(secret: &Path, public: &Path, no_password: bool, force: bool) -> anyhow::Result<()> {
    for p in [secret, public] {
        if p.exists() && !force {
            // An I/O-class error (exit code for files), not an internal one.
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} already exists; pass --force to replace it (signatures made with the old key will no longer verify with the new public key)",
                    p.display()
                ),
            )
            .into());
        }
    }
    let kp = if no_password {
        minisign::KeyPair::generate_unencrypted_keypair()
    } else {
        // None makes minisign prompt twice on the terminal.
        minisign::KeyPair::generate_encrypted_keypair(std::env::var(PASSWORD_ENV).ok())
    }
    .map_err(|e| anyhow::anyhow!("generating the key pair: {e}"))?;
    let sk = kp
        .sk
        .to_box(Some("kubexm bundle signing key"))
        .map_err(|e| anyhow::anyhow!("encoding the secret key: {e}"))?
        .into_string();
    let pk = kp
        .pk
        .to_box()
        .map_err(|e| anyhow::anyhow!("encoding the public key: {e}"))?
        .into_string();
    write_private(secret, sk.as_bytes())?;
    crate::write_atomic(public, pk.as_bytes())?;
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs_err::rename(&tmp, path)?;
    Ok(())
}

/// Signs `file` into `<file>.minisig` with the given trusted comment.
pub fn sign(file: &Path, secret: &Path, trusted_comment: &str) -> anyhow::Result<()> {
    let text = fs_err::read_to_string(secret)?;
    let sk_box = minisign::SecretKeyBox::from_string(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a minisign secret key: {e}", secret.display()))?;
    let password = std::env::var(PASSWORD_ENV).ok();
    let encrypted = sk_box.clone().into_unencrypted_secret_key().is_err();
    let sk = if encrypted {
        sk_box.into_secret_key(password).map_err(|e| {
            anyhow::anyhow!(
                "cannot unlock {}: {e}; set {PASSWORD_ENV} or type the password on a terminal",
                secret.display()
            )
        })?
    } else {
        sk_box
            .into_unencrypted_secret_key()
            .map_err(|e| anyhow::anyhow!("{}: {e}", secret.display()))?
    };
    let data = fs_err::File::open(file)?;
    let sig = minisign::sign(
        None,
        &sk,
        std::io::BufReader::with_capacity(1 << 20, data),
        Some(trusted_comment),
        Some("signature from kubexm-bundle"),
    )
    .map_err(|e| anyhow::anyhow!("signing {}: {e}", file.display()))?;
    crate::write_atomic(&signature_path(file), sig.into_string().as_bytes())
}
