//! What the job database holds for a request's run: named credentials
//! (sealed: only a worker holding the credential key opens them, see
//! [`crate::credentials`]) with the addresses each may be offered to, and
//! the host keys an operator pinned. Neither is ever listed with a secret.

use serde::Serialize;

use super::sql::{self, Cell, Param};
use super::{JobDb, JobDbError, now_ms};

/// SQLite's migration 3: job origins and principals, credentials, host
/// keys, token scopes, expiry and revocation (tokens from before keep
/// `read,create`), and the audit log.
pub(super) const MIGRATION: &str = "ALTER TABLE jobs ADD COLUMN origin TEXT NOT NULL DEFAULT 'request';
    CREATE TABLE credentials (
        name TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        hosts TEXT NOT NULL,
        sealed TEXT NOT NULL,
        created INTEGER NOT NULL
    );
    CREATE TABLE host_keys (endpoint TEXT PRIMARY KEY, key TEXT NOT NULL, added INTEGER NOT NULL);
    ALTER TABLE tokens ADD COLUMN scopes TEXT NOT NULL DEFAULT 'read,create';
    ALTER TABLE tokens ADD COLUMN expires INTEGER;
    ALTER TABLE tokens ADD COLUMN revoked INTEGER;
    ALTER TABLE jobs ADD COLUMN principal TEXT;
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        principal TEXT NOT NULL,
        method TEXT NOT NULL,
        route TEXT NOT NULL,
        job INTEGER,
        status INTEGER NOT NULL
    );
    CREATE TABLE revoked_certs (fingerprint TEXT PRIMARY KEY, name TEXT NOT NULL, at INTEGER NOT NULL);
    CREATE TABLE cluster_owners (name TEXT PRIMARY KEY, principal TEXT NOT NULL, hosts TEXT NOT NULL, created INTEGER NOT NULL);
    INSERT INTO cluster_owners (name, principal, hosts, created) SELECT DISTINCT cluster, 'legacy', '', 0 FROM jobs;";

/// PostgreSQL's migration 2: as SQLite's 3.
pub(super) const MIGRATION_PG: &str = "ALTER TABLE jobs ADD COLUMN origin TEXT NOT NULL DEFAULT 'request';
    CREATE TABLE credentials (
        name TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        hosts TEXT NOT NULL,
        sealed TEXT NOT NULL,
        created BIGINT NOT NULL
    );
    CREATE TABLE host_keys (endpoint TEXT PRIMARY KEY, key TEXT NOT NULL, added BIGINT NOT NULL);
    ALTER TABLE tokens ADD COLUMN scopes TEXT NOT NULL DEFAULT 'read,create';
    ALTER TABLE tokens ADD COLUMN expires BIGINT;
    ALTER TABLE tokens ADD COLUMN revoked BIGINT;
    ALTER TABLE jobs ADD COLUMN principal TEXT;
    CREATE TABLE audit (
        id BIGSERIAL PRIMARY KEY,
        at BIGINT NOT NULL,
        principal TEXT NOT NULL,
        method TEXT NOT NULL,
        route TEXT NOT NULL,
        job BIGINT,
        status INTEGER NOT NULL
    );
    CREATE TABLE revoked_certs (fingerprint TEXT PRIMARY KEY, name TEXT NOT NULL, at BIGINT NOT NULL);
    CREATE TABLE cluster_owners (name TEXT PRIMARY KEY, principal TEXT NOT NULL, hosts TEXT NOT NULL, created BIGINT NOT NULL);
    INSERT INTO cluster_owners (name, principal, hosts, created) SELECT DISTINCT cluster, 'legacy', '', 0 FROM jobs;";

/// What a credential logs in with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialKind {
    SshKey,
    Password,
}

impl CredentialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::SshKey => "ssh-key",
            CredentialKind::Password => "password",
        }
    }

    fn parse(s: &str) -> CredentialKind {
        if s == "ssh-key" {
            CredentialKind::SshKey
        } else {
            CredentialKind::Password
        }
    }
}

/// A stored credential: its secret only sealed.
#[derive(Debug, Clone, Serialize)]
pub struct CredentialRow {
    pub name: String,
    pub kind: CredentialKind,
    /// The CIDRs (or exact host names) it may be offered to.
    pub hosts: Vec<String>,
    #[serde(skip)]
    pub sealed: String,
    pub created: i64,
}

/// A pinned host key.
#[derive(Debug, Clone, Serialize)]
pub struct HostKeyRow {
    /// `address:port`.
    pub endpoint: String,
    /// `type base64`, without a comment.
    pub key: String,
    pub added: i64,
}

fn credential(r: &[Cell]) -> Result<CredentialRow, String> {
    Ok(CredentialRow {
        name: sql::text(r, 0)?,
        kind: CredentialKind::parse(&sql::text(r, 1)?),
        hosts: sql::text(r, 2)?.split(',').filter(|h| !h.is_empty()).map(str::to_string).collect(),
        sealed: sql::text(r, 3)?,
        created: sql::int(r, 4)?,
    })
}

fn host_key(r: &[Cell]) -> Result<HostKeyRow, String> {
    Ok(HostKeyRow {
        endpoint: sql::text(r, 0)?,
        key: sql::text(r, 1)?,
        added: sql::int(r, 2)?,
    })
}

impl JobDb {
    /// Stores (or replaces) the credential `name`.
    pub async fn put_credential(&self, name: &str, kind: CredentialKind, hosts: &[String], sealed: &str) -> Result<(), JobDbError> {
        let hosts = hosts.join(",");
        self.upsert(
            "credentials",
            &["name", "kind", "hosts", "sealed", "created"],
            &[name, kind.as_str(), &hosts, sealed],
        )
        .await
    }

    /// Inserts a row of text `values` and the time as the last column,
    /// replacing the row with the same first column.
    pub(super) async fn upsert(&self, table: &str, columns: &[&str], values: &[&str]) -> Result<(), JobDbError> {
        let marks: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
        let set: Vec<String> = columns[1..].iter().zip(&marks[1..]).map(|(c, m)| format!("{c} = {m}")).collect();
        let sql = format!(
            "INSERT INTO {table} ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}",
            columns.join(", "),
            marks.join(", "),
            columns[0],
            set.join(", ")
        );
        let mut params: Vec<Param> = values.iter().map(|v| (*v).into()).collect();
        params.push(now_ms().into());
        self.backend.execute(&sql, params).await.map(|_| ())
    }

    /// The credential `name`, if there is one.
    pub async fn credential(&self, name: &str) -> Result<Option<CredentialRow>, JobDbError> {
        Ok(self.credentials_where(Some(name)).await?.into_iter().next())
    }

    /// Every credential, by name (their secrets stay sealed).
    pub async fn credentials(&self) -> Result<Vec<CredentialRow>, JobDbError> {
        self.credentials_where(None).await
    }

    async fn credentials_where(&self, name: Option<&str>) -> Result<Vec<CredentialRow>, JobDbError> {
        let sql = "SELECT name, kind, hosts, sealed, created FROM credentials WHERE (CAST($1 AS TEXT) IS NULL OR name = $1) ORDER BY name";
        let rows = self.backend.query(sql, vec![name.into()]).await?;
        rows.iter().map(|r| credential(r).map_err(|e| self.invalid(e))).collect()
    }

    /// Deletes the credential `name`; whether there was one.
    pub async fn delete_credential(&self, name: &str) -> Result<bool, JobDbError> {
        self.delete("credentials", "name", name).await
    }

    /// Pins `key` for `endpoint` (`address:port`), replacing an older pin.
    pub async fn pin_host_key(&self, endpoint: &str, key: &str) -> Result<(), JobDbError> {
        self.upsert("host_keys", &["endpoint", "key", "added"], &[endpoint, key]).await
    }

    /// The key pinned for `endpoint`, if one is.
    pub async fn host_key(&self, endpoint: &str) -> Result<Option<String>, JobDbError> {
        let sql = "SELECT key FROM host_keys WHERE endpoint = $1";
        let rows = self.backend.query(sql, vec![endpoint.into()]).await?;
        rows.first().map(|r| self.text(r, 0)).transpose()
    }

    /// Every pinned host key.
    pub async fn host_keys(&self) -> Result<Vec<HostKeyRow>, JobDbError> {
        let sql = "SELECT endpoint, key, added FROM host_keys ORDER BY endpoint";
        let rows = self.backend.query(sql, Vec::new()).await?;
        rows.iter().map(|r| host_key(r).map_err(|e| self.invalid(e))).collect()
    }

    /// Unpins `endpoint`; whether it was pinned.
    pub async fn delete_host_key(&self, endpoint: &str) -> Result<bool, JobDbError> {
        self.delete("host_keys", "endpoint", endpoint).await
    }

    async fn delete(&self, table: &str, column: &str, value: &str) -> Result<bool, JobDbError> {
        let sql = format!("DELETE FROM {table} WHERE {column} = $1");
        self.backend.execute(&sql, vec![value.into()]).await.map(|n| n > 0)
    }
}
