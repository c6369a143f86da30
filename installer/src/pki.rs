//! The registry's TLS: a CA the installer generates and keeps, and server
//! certificates it signs for the registry host.
//!
//! The CA lives in `<root>/pki/registry/` (directory mode 0700, keys 0600)
//! and is made once: nodes trust it, so it must not change between runs.
//! Server certificates are issued for the names and addresses the registry
//! is reached by.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Cert {
        what: String,
        #[source]
        source: rcgen::Error,
    },
}

/// Paths of a CA.
#[derive(Debug, Clone)]
pub struct Ca {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A server certificate and key, PEM.
#[derive(Debug, Clone)]
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn cert_err(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |source| PkiError::Cert {
        what: what.to_string(),
        source,
    }
}

/// Writes a file readable only by its owner, whole or not at all.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), PkiError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs_err::rename(&tmp, path).map_err(io(path))
}

/// The CA in `dir`, created on first use.
pub fn ensure_ca(dir: &Path, name: &str) -> Result<Ca, PkiError> {
    let ca = Ca {
        cert: dir.join("ca.crt"),
        key: dir.join("ca.key"),
    };
    if ca.cert.exists() && ca.key.exists() {
        return Ok(ca);
    }
    fs_err::create_dir_all(dir).map_err(io(dir))?;
    fs_err::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    let key = KeyPair::generate().map_err(cert_err("generating the CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_err("CA parameters"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "kubexm");
    params.distinguished_name = dn;
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let cert = params.self_signed(&key).map_err(cert_err("self-signing the CA"))?;
    write_private(&ca.key, key.serialize_pem().as_bytes())?;
    fs_err::write(&ca.cert, cert.pem()).map_err(io(&ca.cert))?;
    Ok(ca)
}

/// The kubeadm discovery pin of a CA: the hex sha256 of its public key's
/// SubjectPublicKeyInfo (DER).
pub fn spki_sha256(ca: &Ca) -> Result<String, PkiError> {
    let key = KeyPair::from_pem(&fs_err::read_to_string(&ca.key).map_err(io(&ca.key))?).map_err(cert_err("reading the CA key"))?;
    Ok(kubexm_bundle::digest::sha256_hex(&rcgen::PublicKeyData::subject_public_key_info(
        &key,
    )))
}

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    /// Both: etcd members, which serve and also dial their peers.
    ServerAndClient,
}

/// How leaf certificates are issued: valid `days` from the day they are
/// issued (`certificates.leafDays`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaf {
    pub days: u32,
}

impl Default for Leaf {
    fn default() -> Leaf {
        Leaf {
            days: kubexm_bom::config::model::Certificates::LEAF_DAYS,
        }
    }
}

impl Leaf {
    /// The config's lifetime.
    pub fn of(cluster: &kubexm_bom::config::Cluster) -> Leaf {
        Leaf {
            days: cluster.spec.certificates.leaf_days,
        }
    }

    /// The end of a leaf issued today: the start (UTC) of the day after its
    /// last, so it is valid at least `days` days.
    fn not_after(&self) -> (i32, u8, u8) {
        let (y, m, d) = civil_date(today() + i64::from(self.days) + 1);
        (y as i32, m, d)
    }
}

/// A leaf kept in a PKI directory that ends before the time asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// Its file, `<stem>.crt`.
    pub cert: PathBuf,
    /// Its end, seconds since the epoch (0: unreadable).
    pub not_after: i64,
}

/// Marks every leaf kept in `dir` (`<stem>.crt` with a `<stem>.names`)
/// that ends before `before` (seconds since the epoch) to be issued again:
/// its `.names` goes, so the next [`ensure_cert`] of it issues a new one.
/// A CA is never due here. A leaf no host uses stays marked and unused.
pub fn mark_due(dir: &Path, before: i64) -> Result<Vec<Due>, PkiError> {
    let mut due = Vec::new();
    let entries = match fs_err::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(due),
        Err(e) => return Err(io(dir)(e)),
    };
    for entry in entries {
        let path = entry.map_err(io(dir))?.path();
        let names = path.with_extension("names");
        if path.extension().is_none_or(|e| e != "crt") || !names.exists() {
            continue;
        }
        let end = fs_err::read(&path).ok().and_then(|pem| not_after(&pem)).unwrap_or(0);
        if end < before {
            fs_err::remove_file(&names).map_err(io(&names))?;
            due.push(Due {
                cert: path,
                not_after: end,
            });
        }
    }
    due.sort_by(|a, b| a.cert.cmp(&b.cert));
    Ok(due)
}

/// Days since 1970-01-01, today.
fn today() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64 / 86_400)
        .unwrap_or(0)
}

/// The end (seconds since the epoch) of the PEM certificate `pem`.
pub fn not_after(pem: &[u8]) -> Option<i64> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    Some(p.parse_x509().ok()?.validity().not_after.timestamp())
}

/// A certificate kept in `dir` as `<stem>.crt` and `<stem>.key`, issued by
/// `ca` on first use and reused after, so a re-run changes nothing on hosts.
/// It is issued again when the names it must cover changed (or
/// [`mark_due`] marked it).
pub fn ensure_cert(ca: &Ca, dir: &Path, stem: &str, cn: &str, names: &[String], usage: Usage, leaf: Leaf) -> Result<ServerCert, PkiError> {
    let (crt, key, want) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
        dir.join(format!("{stem}.names")),
    );
    let names_line = names.join(",");
    if crt.exists() && key.exists() && fs_err::read_to_string(&want).ok().as_deref() == Some(names_line.as_str()) {
        return Ok(ServerCert {
            cert_pem: fs_err::read_to_string(&crt).map_err(io(&crt))?,
            key_pem: fs_err::read_to_string(&key).map_err(io(&key))?,
        });
    }
    let c = issue_with(ca, cn, names, usage, &[], leaf.not_after())?;
    write_private(&key, c.key_pem.as_bytes())?;
    fs_err::write(&crt, &c.cert_pem).map_err(io(&crt))?;
    fs_err::write(&want, &names_line).map_err(io(&want))?;
    Ok(c)
}

/// A server certificate signed by `ca` for `names` (DNS names or IP addresses).
pub fn server_cert(ca: &Ca, names: &[String]) -> Result<ServerCert, PkiError> {
    let cn = names.first().cloned().unwrap_or_else(|| "kubexm-registry".into());
    issue_with(ca, &cn, names, Usage::Server, &[], Leaf::default().not_after())
}

/// The civil date (year, month, day) of a day counted from 1970-01-01
/// (Howard Hinnant's algorithm).
pub fn civil_date(days: i64) -> (i64, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m as u8, d as u8)
}

/// A client certificate `<dir>/<stem>.crt` and `.key` for `cn`, its
/// organizations (`O`: what it may do) in its subject, valid for `days`
/// from today. Always issued anew.
pub fn client_cert(ca: &Ca, dir: &Path, stem: &str, cn: &str, orgs: &[String], days: i64) -> Result<ServerCert, PkiError> {
    let (y, m, d) = civil_date(today() + days);
    let c = issue_with(ca, cn, &[], Usage::Client, orgs, (y as i32, m, d))?;
    let (crt, key) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
    write_private(&key, c.key_pem.as_bytes())?;
    fs_err::write(&crt, &c.cert_pem).map_err(io(&crt))?;
    Ok(c)
}

fn issue_with(
    ca: &Ca,
    cn: &str,
    names: &[String],
    usage: Usage,
    orgs: &[String],
    (y, m, d): (i32, u8, u8),
) -> Result<ServerCert, PkiError> {
    let ca_key = KeyPair::from_pem(&fs_err::read_to_string(&ca.key).map_err(io(&ca.key))?).map_err(cert_err("reading the CA key"))?;
    let issuer = Issuer::from_ca_cert_pem(&fs_err::read_to_string(&ca.cert).map_err(io(&ca.cert))?, ca_key)
        .map_err(cert_err("reading the CA certificate"))?;
    let key = KeyPair::generate().map_err(cert_err("generating the server key"))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(cert_err("server certificate names"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    for o in orgs {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    params.distinguished_name = dn;
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    params.extended_key_usages = match usage {
        Usage::Server => vec![ServerAuth],
        Usage::Client => vec![ClientAuth],
        Usage::ServerAndClient => vec![ServerAuth, ClientAuth],
    };
    params.not_after = rcgen::date_time_ymd(y, m, d);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(cert_err("signing the server certificate"))?;
    Ok(ServerCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// What a dry run shows where a value is made at apply time.
pub const GENERATED: &str = "<generated>";

/// A CA as planning uses it: its certificate and key (PEM) and, when it is
/// on disk, where.
#[derive(Debug, Clone)]
pub struct CaPem {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    on_disk: Option<Ca>,
}

/// Where planning gets its CAs and certificates: the installer's PKI
/// directory (`<root>/pki`, made on first use and reused after), or, for a
/// dry run, placeholders that read and write nothing.
#[derive(Debug, Clone)]
pub enum Pki {
    Dir(PathBuf, Leaf),
    DryRun,
}

impl Pki {
    /// The CA kept in `<root>/pki/<sub>`.
    pub fn ca(&self, sub: &str, name: &str) -> Result<CaPem, PkiError> {
        match self {
            Pki::DryRun => Ok(CaPem {
                cert_pem: GENERATED.as_bytes().to_vec(),
                key_pem: GENERATED.as_bytes().to_vec(),
                on_disk: None,
            }),
            Pki::Dir(root, _) => {
                let ca = ensure_ca(&root.join(sub), name)?;
                Ok(CaPem {
                    cert_pem: fs_err::read(&ca.cert).map_err(io(&ca.cert))?,
                    key_pem: fs_err::read(&ca.key).map_err(io(&ca.key))?,
                    on_disk: Some(ca),
                })
            }
        }
    }

    /// A certificate issued by `ca`, kept beside it as `<stem>.crt`/`.key`.
    pub fn cert(&self, ca: &CaPem, stem: &str, cn: &str, names: &[String], usage: Usage) -> Result<ServerCert, PkiError> {
        match (&ca.on_disk, self) {
            (Some(disk), Pki::Dir(_, leaf)) => {
                let dir = disk.cert.parent().unwrap_or(Path::new("."));
                ensure_cert(disk, dir, stem, cn, names, usage, *leaf)
            }
            _ => Ok(ServerCert {
                cert_pem: GENERATED.into(),
                key_pem: GENERATED.into(),
            }),
        }
    }

    /// The kubeadm discovery pin of `ca`.
    pub fn spki_sha256(&self, ca: &CaPem) -> Result<String, PkiError> {
        match &ca.on_disk {
            None => Ok(GENERATED.into()),
            Some(disk) => spki_sha256(disk),
        }
    }

    /// The directory `<root>/pki/<sub>`, or none in a dry run.
    pub fn dir(&self, sub: &str) -> Option<PathBuf> {
        match self {
            Pki::Dir(root, _) => Some(root.join(sub)),
            Pki::DryRun => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn ca_is_made_once_and_signs_server_certs() {
        let dir = tempfile::tempdir().unwrap();
        let ca = super::ensure_ca(&dir.path().join("pki"), "test CA").unwrap();
        let first = std::fs::read(&ca.cert).unwrap();
        let again = super::ensure_ca(&dir.path().join("pki"), "test CA").unwrap();
        assert_eq!(first, std::fs::read(again.cert).unwrap());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&ca.key).unwrap().permissions().mode() & 0o777, 0o600);
        let s = super::server_cert(&ca, &["127.0.0.1".into(), "registry.local".into()]).unwrap();
        assert!(s.cert_pem.contains("BEGIN CERTIFICATE") && s.key_pem.contains("PRIVATE KEY"));
    }

    /// Issue 29: a leaf lives `leafDays`; one due is marked and issued anew
    /// once (a second ensure reuses it), a CA and a fresh leaf are not.
    #[test]
    fn a_leaf_due_is_issued_again_once() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let pki = dir.path().join("pki");
        let ca = super::ensure_ca(&pki, "test CA")?;
        let five = super::Leaf { days: 5 };
        let names = ["a".to_string()];
        let first = super::ensure_cert(&ca, &pki, "a", "a", &names, super::Usage::Server, five)?;
        let end_of = |pem: &str| super::not_after(pem.as_bytes()).ok_or_else(|| anyhow::anyhow!("unreadable: {pem}"));
        let end = end_of(&first.cert_pem)?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
        assert!(end >= now + 5 * 86_400 && end <= now + 6 * 86_400, "{end} vs {now}");
        // Not due within 5 days; due within 30.
        assert!(super::mark_due(&pki, now + 5 * 86_400)?.is_empty());
        let due = super::mark_due(&pki, now + 30 * 86_400)?;
        let due: Vec<PathBuf> = due.into_iter().map(|d| d.cert).collect();
        assert_eq!(due, [pki.join("a.crt")]);
        let year = super::Leaf::default();
        let again = super::ensure_cert(&ca, &pki, "a", "a", &names, super::Usage::Server, year)?;
        assert_ne!(again.cert_pem, first.cert_pem);
        assert!(end_of(&again.cert_pem)? > now + 300 * 86_400);
        let kept = super::ensure_cert(&ca, &pki, "a", "a", &names, super::Usage::Server, year)?;
        assert_eq!(kept.cert_pem, again.cert_pem, "issued once");
        assert!(super::mark_due(&pki, now + 30 * 86_400)?.is_empty());
        assert!(super::mark_due(&dir.path().join("none"), i64::MAX)?.is_empty());
        Ok(())
    }
}
