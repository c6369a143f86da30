//! Who may use the API, and what they did: bearer tokens with scopes, an
//! expiry and a revocation (only their sha256 is kept), and the append-only
//! audit log of every mutating request and every refusal.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{Backend, JobDb, JobDbError, now_ms};

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Read jobs and their logs.
    Read,
    /// Create install and facts jobs; cancel jobs.
    Create,
    /// Destructive jobs: reset (and later remove node, delete, restore, upgrade, certs renew).
    Reset,
    /// Manage named credentials.
    Credential,
    /// Manage pinned host keys.
    HostKey,
    /// Everything.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 6] = [
        Scope::Read,
        Scope::Create,
        Scope::Reset,
        Scope::Credential,
        Scope::HostKey,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Create => "create",
            Scope::Reset => "reset",
            Scope::Credential => "credential",
            Scope::HostKey => "host-key",
            Scope::Admin => "admin",
        }
    }

    /// `read,create,...`; an unknown name is an error naming the known ones.
    pub fn parse_list(s: &str) -> Result<Vec<Scope>, String> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let scope = Scope::ALL
                .into_iter()
                .find(|x| x.as_str() == name)
                .ok_or_else(|| format!("unknown scope {name:?}; scopes: {}", Scope::ALL.map(Scope::as_str).join(", ")))?;
            if !out.contains(&scope) {
                out.push(scope);
            }
        }
        out.sort();
        Ok(out)
    }

    pub fn join(scopes: &[Scope]) -> String {
        scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
    }
}

/// A stored token, never its value.
#[derive(Debug, Clone, Serialize)]
pub struct TokenRow {
    pub id: i64,
    pub name: String,
    pub scopes: Vec<Scope>,
    pub created: i64,
    pub expires: Option<i64>,
    pub revoked: Option<i64>,
}

impl TokenRow {
    /// Neither revoked nor expired at `now`.
    pub fn valid(&self, now: i64) -> bool {
        self.revoked.is_none() && self.expires.is_none_or(|e| e > now)
    }

    /// Whether it may do what `needed` allows.
    pub fn allows(&self, needed: Scope) -> bool {
        self.scopes.contains(&needed) || self.scopes.contains(&Scope::Admin)
    }
}

/// One audited request.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRow {
    pub id: i64,
    pub at: i64,
    pub principal: String,
    pub method: String,
    pub route: String,
    pub job: Option<i64>,
    pub status: i64,
}

type RawToken = (i64, String, String, i64, Option<i64>, Option<i64>);
type RawAudit = (i64, i64, String, String, String, Option<i64>, i64);

fn token_row(r: RawToken) -> TokenRow {
    TokenRow {
        id: r.0,
        name: r.1,
        scopes: Scope::parse_list(&r.2).unwrap_or_default(),
        created: r.3,
        expires: r.4,
        revoked: r.5,
    }
}

const TOKEN_COLUMNS: &str = "id, name, scopes, created, expires, revoked";

impl JobDb {
    /// A new token named `name` with `scopes`, valid until `expires` (ms
    /// since the epoch) if given; returns the token, shown once.
    pub fn create_token_scoped(&self, name: &str, scopes: &[Scope], expires: Option<i64>) -> Result<String, JobDbError> {
        let token = format!(
            "kxm_{}",
            hex::encode(kubexm_installer::kube_pki::random_bytes(32).map_err(|e| JobDbError::Invalid {
                path: self.path.clone(),
                what: format!("reading /dev/urandom: {e}"),
            })?)
        );
        let hash = kubexm_bundle::digest::sha256_hex(token.as_bytes());
        let (scopes, now) = (Scope::join(scopes), now_ms());
        let sql = "INSERT INTO tokens (name, sha256, created, scopes, expires) VALUES ($1, $2, $3, $4, $5)";
        if let Backend::Postgres(pg) = &self.backend {
            pg.run(async {
                sqlx::query(sql)
                    .bind(name)
                    .bind(&hash)
                    .bind(now)
                    .bind(&scopes)
                    .bind(expires)
                    .execute(&pg.pool)
                    .await
                    .map(|_| ())
            })?;
        } else {
            self.with(|c| {
                c.execute(&sql.replace('$', "?"), params![name, hash, now, scopes, expires])
                    .map(|_| ())
            })?;
        }
        Ok(token)
    }

    /// The token `token`, if it is one (valid or not: see [`TokenRow::valid`]).
    pub fn token(&self, token: &str) -> Result<Option<TokenRow>, JobDbError> {
        let hash = kubexm_bundle::digest::sha256_hex(token.as_bytes());
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE sha256 = $1");
        let row: Option<RawToken> = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async { sqlx::query_as(&sql).bind(&hash).fetch_optional(&pg.pool).await })?
        } else {
            self.with(|c| {
                c.query_row(&sql.replace('$', "?"), [&hash], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
                })
                .optional()
            })?
        };
        Ok(row.map(token_row))
    }

    /// Every token, oldest first (never their values).
    pub fn tokens(&self) -> Result<Vec<TokenRow>, JobDbError> {
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id");
        let rows: Vec<RawToken> = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async { sqlx::query_as(&sql).fetch_all(&pg.pool).await })?
        } else {
            self.with(|c| {
                let mut st = c.prepare(&sql)?;
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))?
                    .collect()
            })?
        };
        Ok(rows.into_iter().map(token_row).collect())
    }

    /// Revokes the tokens with id or name `which`; how many were.
    pub fn revoke_token(&self, which: &str) -> Result<u64, JobDbError> {
        let id: i64 = which.parse().unwrap_or(-1);
        let now = now_ms();
        let sql = "UPDATE tokens SET revoked = $1 WHERE revoked IS NULL AND (id = $2 OR name = $3)";
        if let Backend::Postgres(pg) = &self.backend {
            return pg.run(async {
                sqlx::query(sql)
                    .bind(now)
                    .bind(id)
                    .bind(which)
                    .execute(&pg.pool)
                    .await
                    .map(|r| r.rows_affected())
            });
        }
        self.with(|c| c.execute(&sql.replace('$', "?"), params![now, id, which]).map(|n| n as u64))
    }

    /// Appends one audited request.
    pub fn audit(&self, principal: &str, method: &str, route: &str, job: Option<i64>, status: u16) -> Result<(), JobDbError> {
        let (principal, route) = (crate::text::line(principal), crate::text::line(route));
        let now = now_ms();
        let sql = "INSERT INTO audit (at, principal, method, route, job, status) VALUES ($1, $2, $3, $4, $5, $6)";
        if let Backend::Postgres(pg) = &self.backend {
            return pg.run(async {
                sqlx::query(sql)
                    .bind(now)
                    .bind(principal.as_ref())
                    .bind(method)
                    .bind(route.as_ref())
                    .bind(job)
                    .bind(status as i32)
                    .execute(&pg.pool)
                    .await
                    .map(|_| ())
            });
        }
        self.with(|c| {
            c.execute(&sql.replace('$', "?"), params![now, principal, method, route, job, status as i64])
                .map(|_| ())
        })
    }

    /// The audit log, oldest first.
    pub fn audit_log(&self) -> Result<Vec<AuditRow>, JobDbError> {
        let sql = "SELECT id, at, principal, method, route, job, CAST(status AS BIGINT) FROM audit ORDER BY id";
        let rows: Vec<RawAudit> = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async { sqlx::query_as(sql).fetch_all(&pg.pool).await })?
        } else {
            self.with(|c| {
                let mut st = c.prepare(sql)?;
                st.query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
                })?
                .collect()
            })?
        };
        Ok(rows
            .into_iter()
            .map(|r| AuditRow {
                id: r.0,
                at: r.1,
                principal: r.2,
                method: r.3,
                route: r.4,
                job: r.5,
                status: r.6,
            })
            .collect())
    }

    /// Revokes the client certificate with sha256 `fingerprint` (of its DER).
    pub fn revoke_cert(&self, fingerprint: &str, name: &str) -> Result<(), JobDbError> {
        self.upsert("revoked_certs", &["fingerprint", "name", "at"], &[fingerprint, name])
    }

    /// Whether the client certificate with sha256 `fingerprint` is revoked.
    pub fn cert_revoked(&self, fingerprint: &str) -> Result<bool, JobDbError> {
        let sql = "SELECT COUNT(*) FROM revoked_certs WHERE fingerprint = $1";
        let n: i64 = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async { sqlx::query_scalar(sql).bind(fingerprint).fetch_one(&pg.pool).await })?
        } else {
            self.with(|c| c.query_row(&sql.replace('$', "?"), [fingerprint], |r| r.get(0)))?
        };
        Ok(n > 0)
    }

    /// Binds cluster `name` to `principal` and `hosts` (addresses) at its
    /// first job; later, `Err(why)` when another principal names it or it
    /// names a host outside the record. `check: false` (the operator's own
    /// job on this machine) only records a binding that is missing. A name
    /// with no binding that `exists` already (installed outside the job
    /// database, on the server's machine) is not bound to a request.
    pub fn bind_cluster(
        &self,
        name: &str,
        principal: &str,
        hosts: &[String],
        check: bool,
        exists: bool,
    ) -> Result<Result<(), String>, JobDbError> {
        if check && exists && !self.cluster_bound(name)? {
            return Ok(Err(format!(
                "cluster {name} already exists on the server's machine (installed outside the API); a token with the admin scope may act on it"
            )));
        }
        let mut sorted = hosts.to_vec();
        sorted.sort();
        sorted.dedup();
        let (joined, now) = (sorted.join(","), now_ms());
        let insert = "INSERT INTO cluster_owners (name, principal, hosts, created) VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING";
        let select = "SELECT principal, hosts FROM cluster_owners WHERE name = $1";
        let (owner, recorded): (String, String) = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async {
                sqlx::query(insert)
                    .bind(name)
                    .bind(principal)
                    .bind(&joined)
                    .bind(now)
                    .execute(&pg.pool)
                    .await?;
                sqlx::query_as(select).bind(name).fetch_one(&pg.pool).await
            })?
        } else {
            self.with(|c| {
                c.execute(&insert.replace('$', "?"), params![name, principal, joined, now])?;
                c.query_row(&select.replace('$', "?"), [name], |r| Ok((r.get(0)?, r.get(1)?)))
            })?
        };
        if !check {
            return Ok(Ok(()));
        }
        if owner != principal {
            return Ok(Err(format!(
                "cluster {name} was created by another principal; choose another name (a cluster's jobs come from the principal that created it)"
            )));
        }
        let known: Vec<&str> = recorded.split(',').collect();
        let outside: Vec<&String> = sorted.iter().filter(|h| !known.contains(&h.as_str())).collect();
        if !outside.is_empty() {
            return Ok(Err(format!(
                "cluster {name} was created with other hosts; {} {} not among them",
                outside.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(", "),
                if outside.len() == 1 { "is" } else { "are" }
            )));
        }
        Ok(Ok(()))
    }

    /// Deletes finished jobs that ended before `before` (ms since the
    /// epoch), with their log lines, and audit entries older than that;
    /// how many jobs.
    pub fn prune(&self, before: i64) -> Result<u64, JobDbError> {
        let ended = "status IN ('Success', 'Failed', 'Cancelled') AND finished < $1";
        let logs = format!("DELETE FROM job_logs WHERE job IN (SELECT id FROM jobs WHERE {ended})");
        let jobs = format!("DELETE FROM jobs WHERE {ended}");
        let audit = "DELETE FROM audit WHERE at < $1";
        if let Backend::Postgres(pg) = &self.backend {
            return pg.run(async {
                let mut tx = pg.pool.begin().await?;
                sqlx::query(&logs).bind(before).execute(&mut *tx).await?;
                sqlx::query(audit).bind(before).execute(&mut *tx).await?;
                let n = sqlx::query(&jobs).bind(before).execute(&mut *tx).await?.rows_affected();
                tx.commit().await?;
                Ok(n)
            });
        }
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(&logs.replace('$', "?"), [before])?;
            tx.execute(&audit.replace('$', "?"), [before])?;
            let n = tx.execute(&jobs.replace('$', "?"), [before])?;
            tx.commit()?;
            Ok(n as u64)
        })
    }

    /// Whether cluster `name` has a binding.
    fn cluster_bound(&self, name: &str) -> Result<bool, JobDbError> {
        let sql = "SELECT COUNT(*) FROM cluster_owners WHERE name = $1";
        let n: i64 = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async { sqlx::query_scalar(sql).bind(name).fetch_one(&pg.pool).await })?
        } else {
            self.with(|c| c.query_row(&sql.replace('$', "?"), [name], |r| r.get(0)))?
        };
        Ok(n > 0)
    }
}
