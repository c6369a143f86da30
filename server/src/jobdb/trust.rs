//! What the job database holds for a request's run: named credentials
//! (sealed: only a worker holding the credential key opens them, see
//! [`crate::credentials`]) with the addresses each may be offered to, and
//! the host keys an operator pinned. Neither is ever listed with a secret.

use rusqlite::OptionalExtension;
use serde::Serialize;

use super::{Backend, JobDb, JobDbError, now_ms};

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

type Raw = (String, String, String, String, i64);

fn credential(r: Raw) -> CredentialRow {
    CredentialRow {
        name: r.0,
        kind: CredentialKind::parse(&r.1),
        hosts: r.2.split(',').filter(|h| !h.is_empty()).map(str::to_string).collect(),
        sealed: r.3,
        created: r.4,
    }
}

impl JobDb {
    /// Stores (or replaces) the credential `name`.
    pub fn put_credential(&self, name: &str, kind: CredentialKind, hosts: &[String], sealed: &str) -> Result<(), JobDbError> {
        let hosts = hosts.join(",");
        self.upsert(
            "credentials",
            &["name", "kind", "hosts", "sealed", "created"],
            &[name, kind.as_str(), &hosts, sealed],
        )
    }

    /// Inserts a row of text `values` and the time as the last column,
    /// replacing the row with the same first column.
    pub(super) fn upsert(&self, table: &str, columns: &[&str], values: &[&str]) -> Result<(), JobDbError> {
        let now = now_ms();
        let marks: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
        let insert = format!("INSERT INTO {table} ({}) VALUES ({})", columns.join(", "), marks.join(", "));
        if let Backend::Postgres(pg) = &self.backend {
            let set: Vec<String> = columns[1..].iter().zip(&marks[1..]).map(|(c, m)| format!("{c} = {m}")).collect();
            let sql = format!("{insert} ON CONFLICT ({}) DO UPDATE SET {}", columns[0], set.join(", "));
            return pg.run(async {
                let mut q = sqlx::query(&sql);
                for v in values {
                    q = q.bind(*v);
                }
                q.bind(now).execute(&pg.pool).await.map(|_| ())
            });
        }
        let sql = insert.replacen("INSERT", "INSERT OR REPLACE", 1).replace('$', "?");
        self.with(|c| {
            let mut p: Vec<&dyn rusqlite::ToSql> = values.iter().map(|v| v as &dyn rusqlite::ToSql).collect();
            p.push(&now);
            c.execute(&sql, p.as_slice()).map(|_| ())
        })
    }

    /// The credential `name`, if there is one.
    pub fn credential(&self, name: &str) -> Result<Option<CredentialRow>, JobDbError> {
        Ok(self.credentials_where(Some(name))?.into_iter().next())
    }

    /// Every credential, by name (their secrets stay sealed).
    pub fn credentials(&self) -> Result<Vec<CredentialRow>, JobDbError> {
        self.credentials_where(None)
    }

    fn credentials_where(&self, name: Option<&str>) -> Result<Vec<CredentialRow>, JobDbError> {
        let sql = "SELECT name, kind, hosts, sealed, created FROM credentials WHERE ($1 IS NULL OR name = $1) ORDER BY name";
        let rows: Vec<Raw> = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async {
                sqlx::query_as::<_, Raw>(&sql.replace("$1 IS NULL", "$1::TEXT IS NULL"))
                    .bind(name)
                    .fetch_all(&pg.pool)
                    .await
            })?
        } else {
            self.with(|c| {
                let mut st = c.prepare(&sql.replace('$', "?"))?;
                st.query_map([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?
                    .collect()
            })?
        };
        Ok(rows.into_iter().map(credential).collect())
    }

    /// Deletes the credential `name`; whether there was one.
    pub fn delete_credential(&self, name: &str) -> Result<bool, JobDbError> {
        self.delete("credentials", "name", name)
    }

    /// Pins `key` for `endpoint` (`address:port`), replacing an older pin.
    pub fn pin_host_key(&self, endpoint: &str, key: &str) -> Result<(), JobDbError> {
        self.upsert("host_keys", &["endpoint", "key", "added"], &[endpoint, key])
    }

    /// The key pinned for `endpoint`, if one is.
    pub fn host_key(&self, endpoint: &str) -> Result<Option<String>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.run(async {
                sqlx::query_scalar("SELECT key FROM host_keys WHERE endpoint = $1")
                    .bind(endpoint)
                    .fetch_optional(&pg.pool)
                    .await
            });
        }
        self.with(|c| {
            c.query_row("SELECT key FROM host_keys WHERE endpoint = ?1", [endpoint], |r| r.get(0))
                .optional()
        })
    }

    /// Every pinned host key.
    pub fn host_keys(&self) -> Result<Vec<HostKeyRow>, JobDbError> {
        let sql = "SELECT endpoint, key, added FROM host_keys ORDER BY endpoint";
        let rows: Vec<(String, String, i64)> = if let Backend::Postgres(pg) = &self.backend {
            pg.run(async { sqlx::query_as(sql).fetch_all(&pg.pool).await })?
        } else {
            self.with(|c| {
                let mut st = c.prepare(sql)?;
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect()
            })?
        };
        Ok(rows
            .into_iter()
            .map(|(endpoint, key, added)| HostKeyRow { endpoint, key, added })
            .collect())
    }

    /// Unpins `endpoint`; whether it was pinned.
    pub fn delete_host_key(&self, endpoint: &str) -> Result<bool, JobDbError> {
        self.delete("host_keys", "endpoint", endpoint)
    }

    fn delete(&self, table: &str, column: &str, value: &str) -> Result<bool, JobDbError> {
        let sql = format!("DELETE FROM {table} WHERE {column} = $1");
        if let Backend::Postgres(pg) = &self.backend {
            return pg.run(async { sqlx::query(&sql).bind(value).execute(&pg.pool).await.map(|r| r.rows_affected() > 0) });
        }
        self.with(|c| c.execute(&sql.replace('$', "?"), [value]).map(|n| n > 0))
    }
}
