//! Who may use the API, and what they did: bearer tokens with scopes, an
//! expiry and a revocation (only their sha256 is kept), and the append-only
//! audit log of every mutating request and every refusal.

use serde::Serialize;

use super::sql::{self, Cell};
use super::{JobDb, JobDbError, now_ms};

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

const TOKEN_COLUMNS: &str = "id, name, scopes, created, expires, revoked";

fn token_row(r: &[Cell]) -> Result<TokenRow, String> {
    Ok(TokenRow {
        id: sql::int(r, 0)?,
        name: sql::text(r, 1)?,
        scopes: Scope::parse_list(&sql::text(r, 2)?).unwrap_or_default(),
        created: sql::int(r, 3)?,
        expires: sql::maybe_int(r, 4)?,
        revoked: sql::maybe_int(r, 5)?,
    })
}

fn audit_row(r: &[Cell]) -> Result<AuditRow, String> {
    Ok(AuditRow {
        id: sql::int(r, 0)?,
        at: sql::int(r, 1)?,
        principal: sql::text(r, 2)?,
        method: sql::text(r, 3)?,
        route: sql::text(r, 4)?,
        job: sql::maybe_int(r, 5)?,
        status: sql::int(r, 6)?,
    })
}

impl JobDb {
    /// A new token named `name` with `scopes`, valid until `expires` (ms
    /// since the epoch) if given; returns the token, shown once.
    pub async fn create_token_scoped(&self, name: &str, scopes: &[Scope], expires: Option<i64>) -> Result<String, JobDbError> {
        let token = format!(
            "kxm_{}",
            hex::encode(kubexm_installer::kube_pki::random_bytes(32).map_err(|e| self.invalid(format!("reading /dev/urandom: {e}")))?)
        );
        let hash = kubexm_bundle::digest::sha256_hex(token.as_bytes());
        let sql = "INSERT INTO tokens (name, sha256, created, scopes, expires) VALUES ($1, $2, $3, $4, $5)";
        let params = vec![
            name.into(),
            hash.into(),
            now_ms().into(),
            Scope::join(scopes).into(),
            expires.into(),
        ];
        self.backend.execute(sql, params).await?;
        Ok(token)
    }

    /// The token `token`, if it is one (valid or not: see [`TokenRow::valid`]).
    pub async fn token(&self, token: &str) -> Result<Option<TokenRow>, JobDbError> {
        let hash = kubexm_bundle::digest::sha256_hex(token.as_bytes());
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE sha256 = $1");
        let rows = self.backend.query(&sql, vec![hash.into()]).await?;
        rows.first().map(|r| token_row(r).map_err(|e| self.invalid(e))).transpose()
    }

    /// Every token, oldest first (never their values).
    pub async fn tokens(&self) -> Result<Vec<TokenRow>, JobDbError> {
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id");
        let rows = self.backend.query(&sql, Vec::new()).await?;
        rows.iter().map(|r| token_row(r).map_err(|e| self.invalid(e))).collect()
    }

    /// Revokes the tokens with id or name `which`; how many were.
    pub async fn revoke_token(&self, which: &str) -> Result<u64, JobDbError> {
        let id: i64 = which.parse().unwrap_or(-1);
        let sql = "UPDATE tokens SET revoked = $1 WHERE revoked IS NULL AND (id = $2 OR name = $3)";
        self.backend.execute(sql, vec![now_ms().into(), id.into(), which.into()]).await
    }

    /// Appends one audited request.
    pub async fn audit(&self, principal: &str, method: &str, route: &str, job: Option<i64>, status: u16) -> Result<(), JobDbError> {
        let (principal, route) = (crate::text::line(principal), crate::text::line(route));
        let sql = "INSERT INTO audit (at, principal, method, route, job, status) VALUES ($1, $2, $3, $4, $5, $6)";
        let params = vec![
            now_ms().into(),
            principal.as_ref().into(),
            method.into(),
            route.as_ref().into(),
            job.into(),
            i64::from(status).into(),
        ];
        self.backend.execute(sql, params).await.map(|_| ())
    }

    /// The audit log, oldest first.
    pub async fn audit_log(&self) -> Result<Vec<AuditRow>, JobDbError> {
        let sql = "SELECT id, at, principal, method, route, job, CAST(status AS BIGINT) FROM audit ORDER BY id";
        let rows = self.backend.query(sql, Vec::new()).await?;
        rows.iter().map(|r| audit_row(r).map_err(|e| self.invalid(e))).collect()
    }

    /// Revokes the client certificate with sha256 `fingerprint` (of its DER).
    pub async fn revoke_cert(&self, fingerprint: &str, name: &str) -> Result<(), JobDbError> {
        self.upsert("revoked_certs", &["fingerprint", "name", "at"], &[fingerprint, name])
            .await
    }

    /// Whether the client certificate with sha256 `fingerprint` is revoked.
    pub async fn cert_revoked(&self, fingerprint: &str) -> Result<bool, JobDbError> {
        self.count("SELECT COUNT(*) FROM revoked_certs WHERE fingerprint = $1", fingerprint)
            .await
            .map(|n| n > 0)
    }

    /// Binds cluster `name` to `principal` and `hosts` (addresses) at its
    /// first job; later, `Err(why)` when another principal names it or it
    /// names a host outside the record. `check: false` (the operator's own
    /// job on this machine) only records a binding that is missing. A name
    /// with no binding that `exists` already (installed outside the job
    /// database, on the server's machine) is not bound to a request.
    pub async fn bind_cluster(
        &self,
        name: &str,
        principal: &str,
        hosts: &[String],
        check: bool,
        exists: bool,
    ) -> Result<Result<(), String>, JobDbError> {
        if check && exists && !self.cluster_bound(name).await? {
            return Ok(Err(format!(
                "cluster {name} already exists on the server's machine (installed outside the API); a token with the admin scope may act on it"
            )));
        }
        let mut sorted = hosts.to_vec();
        sorted.sort();
        sorted.dedup();
        let insert = "INSERT INTO cluster_owners (name, principal, hosts, created) VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING";
        let params = vec![name.into(), principal.into(), sorted.join(",").into(), now_ms().into()];
        self.backend.execute(insert, params).await?;
        let select = "SELECT principal, hosts FROM cluster_owners WHERE name = $1";
        let rows = self.backend.query(select, vec![name.into()]).await?;
        let row = rows
            .first()
            .ok_or_else(|| self.invalid(format!("cluster {name}: its binding vanished")))?;
        let (owner, recorded) = (self.text(row, 0)?, self.text(row, 1)?);
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
    /// epoch), with their log lines and timelines, and audit entries older than that;
    /// how many jobs.
    pub async fn prune(&self, before: i64) -> Result<u64, JobDbError> {
        let ended = "status IN ('Success', 'Failed', 'Cancelled') AND finished < $1";
        let statements = vec![
            (
                format!("DELETE FROM job_logs WHERE job IN (SELECT id FROM jobs WHERE {ended})"),
                vec![before.into()],
            ),
            (
                format!("DELETE FROM job_timelines WHERE job IN (SELECT id FROM jobs WHERE {ended})"),
                vec![before.into()],
            ),
            ("DELETE FROM audit WHERE at < $1".to_string(), vec![before.into()]),
            (format!("DELETE FROM jobs WHERE {ended}"), vec![before.into()]),
        ];
        let changed = self.backend.execute_all(statements).await?;
        Ok(changed.last().copied().unwrap_or(0))
    }

    /// Whether cluster `name` has a binding.
    async fn cluster_bound(&self, name: &str) -> Result<bool, JobDbError> {
        self.count("SELECT COUNT(*) FROM cluster_owners WHERE name = $1", name)
            .await
            .map(|n| n > 0)
    }

    /// The one integer `sql` (with one text parameter) reads.
    async fn count(&self, sql: &str, value: &str) -> Result<i64, JobDbError> {
        let rows = self.backend.query(sql, vec![value.into()]).await?;
        let row = rows.first().map(Vec::as_slice).unwrap_or_default();
        sql::int(row, 0).map_err(|e| self.invalid(e))
    }
}
