//! `kubexm token`, `credential` and `host-key`: what the job database
//! holds for the API server (bearer tokens, sealed SSH credentials, pinned
//! host keys), administered from the command line.

use kubexm_cli::{Class, classified};
use kubexm_server::credentials;
use kubexm_server::jobdb::{JobDb, Scope};

use crate::args::*;
use crate::print::*;

/// `kubexm token create|list|revoke`.
pub(crate) async fn token(db: &JobDb, what: TokenCmd) -> anyhow::Result<()> {
    let usage = |e: String| classified(Class::Usage, anyhow::anyhow!(e));
    match what {
        TokenCmd::Create { name, scopes, ttl } => {
            let scopes = Scope::parse_list(&scopes).map_err(|e| usage(format!("--scopes: {e}")))?;
            let expires = ttl
                .map(|t| duration_ms(&t).map(|ms| kubexm_server::jobdb::now_ms() + ms))
                .transpose()
                .map_err(|e| usage(format!("--ttl: {e}")))?;
            let token = db.create_token_scoped(&name, &scopes, expires).await?;
            println!("{token}");
            eprintln!(
                "token {name:?} ({}{}): shown once; {} keeps only its sha256. Put it in a file (mode 0600) named by tokenFile in the client config.",
                Scope::join(&scopes),
                expires.map(|e| format!(", until {}", utc(e))).unwrap_or_default(),
                db.path().display()
            );
            Ok(())
        }
        TokenCmd::List { output } => {
            let rows = db.tokens().await?;
            match output {
                Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                Format::Yaml => print!("{}", serde_saphyr::to_string(&rows)?),
                Format::Text => {
                    println!(
                        "{:<5} {:<20} {:<28} {:<21} {:<21} REVOKED",
                        "ID", "NAME", "SCOPES", "CREATED", "EXPIRES"
                    );
                    let t = |v: Option<i64>| v.map(utc).unwrap_or_else(|| "-".into());
                    for r in rows {
                        println!(
                            "{:<5} {:<20} {:<28} {:<21} {:<21} {}",
                            r.id,
                            r.name,
                            Scope::join(&r.scopes),
                            utc(r.created),
                            t(r.expires),
                            t(r.revoked)
                        );
                    }
                }
            }
            Ok(())
        }
        TokenCmd::Revoke { token } => match db.revoke_token(&token).await? {
            0 => Err(usage(format!("no token with id or name {token:?} is valid (`kubexm token list`)"))),
            n => {
                eprintln!("{n} token(s) revoked: refused from the next request on");
                Ok(())
            }
        },
    }
}

/// `90m`, `12h`, `30d` or seconds, in milliseconds.
fn duration_ms(s: &str) -> Result<i64, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = n.parse().map_err(|_| format!("{s:?} is not a duration such as 90m, 12h or 30d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit is s, m, h or d")),
    };
    if n <= 0 {
        return Err(format!("{s:?} is not a positive duration"));
    }
    Ok(n.saturating_mul(secs).saturating_mul(1000))
}

/// `kubexm credential create|list|delete`.
pub(crate) async fn credential(db: &JobDb, key: &std::path::Path, what: CredentialCmd) -> anyhow::Result<()> {
    match what {
        CredentialCmd::Create {
            name,
            ssh_key,
            passphrase_from_file,
            password_from_file,
            hosts,
        } => {
            let secret = match (ssh_key, password_from_file) {
                (Some(key), _) => credentials::NewSecret::SshKey {
                    key,
                    passphrase: passphrase_from_file,
                },
                (None, Some(file)) => credentials::NewSecret::Password { file },
                (None, None) => unreachable!("clap requires one"),
            };
            let seal = credentials::SealKey::load_or_create(key).map_err(|e| classified(Class::Io, e))?;
            let kind = credentials::create(db, &seal, &name, secret, &hosts)
                .await
                .map_err(|e| classified(Class::Usage, e))?;
            eprintln!(
                "credential {name} ({}) sealed with {} and stored; offered only to {}. Workers open it with a copy of that key (mode 0600).",
                kind.as_str(),
                key.display(),
                hosts.join(",")
            );
            Ok(())
        }
        CredentialCmd::List { output } => {
            let rows = db.credentials().await?;
            match output {
                Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                Format::Yaml => print!("{}", serde_saphyr::to_string(&rows)?),
                Format::Text => {
                    println!("{:<24} {:<9} {:<20} HOSTS", "NAME", "KIND", "CREATED");
                    for r in rows {
                        println!("{:<24} {:<9} {:<20} {}", r.name, r.kind.as_str(), utc(r.created), r.hosts.join(","));
                    }
                }
            }
            Ok(())
        }
        CredentialCmd::Delete { name } => match db.delete_credential(&name).await? {
            true => {
                eprintln!("credential {name} deleted");
                Ok(())
            }
            false => Err(classified(Class::Usage, anyhow::anyhow!("no credential named {name:?}"))),
        },
    }
}

/// `kubexm host-key add|scan|list|delete`.
pub(crate) async fn host_key(db: &JobDb, what: HostKeyCmd) -> anyhow::Result<()> {
    let usage = |e: anyhow::Error| classified(Class::Usage, e);
    match what {
        HostKeyCmd::Add { endpoint, key } => {
            let (endpoint, key) = (
                credentials::endpoint(&endpoint).map_err(usage)?,
                credentials::normalize_host_key(&key).map_err(usage)?,
            );
            db.pin_host_key(&endpoint, &key).await?;
            eprintln!("{endpoint}: {key} pinned");
            Ok(())
        }
        HostKeyCmd::Scan { endpoint, yes } => {
            let endpoint = credentials::endpoint(&endpoint).map_err(usage)?;
            let (addr, port) = endpoint.rsplit_once(':').unwrap_or((&endpoint, "22"));
            let key = kubexm_installer::engine::ssh::scan(addr, port.parse()?, std::time::Duration::from_secs(10))
                .await
                .map_err(|e| classified(Class::Host, e))?;
            println!("{endpoint} {key}");
            if yes {
                db.pin_host_key(&endpoint, &key).await?;
                eprintln!("pinned: requests' jobs connect to {endpoint} only while it offers this key");
            } else {
                eprintln!(
                    "not pinned: check this key against the host (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on its console), then run again with --yes"
                );
            }
            Ok(())
        }
        HostKeyCmd::List { output } => {
            let rows = db.host_keys().await?;
            match output {
                Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                Format::Yaml => print!("{}", serde_saphyr::to_string(&rows)?),
                Format::Text => {
                    for r in rows {
                        println!("{} {}", r.endpoint, r.key);
                    }
                }
            }
            Ok(())
        }
        HostKeyCmd::Delete { endpoint } => {
            let endpoint = credentials::endpoint(&endpoint).map_err(usage)?;
            match db.delete_host_key(&endpoint).await? {
                true => {
                    eprintln!("{endpoint}: unpinned");
                    Ok(())
                }
                false => Err(usage(anyhow::anyhow!("no key is pinned for {endpoint}"))),
            }
        }
    }
}
