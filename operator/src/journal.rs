//! The controller's state inside the cluster, where a restarted or
//! failed-over leader finds it. The engine keeps jobs, step results,
//! cluster records and pinned host keys in the installer's SQLite state
//! database: inside the cluster that database is a working copy in the
//! leader's pod, and every write to it is also appended to a journal of
//! ConfigMaps in `kubexm-system` ([`Journaled`]). A leader that starts reads
//! the journal back into a new working copy before it acts, so a run the
//! last leader left half done skips the steps it finished.
//!
//! Why objects and not a hostPath on the control-plane nodes: the replica
//! that takes over runs on another node, which has none of the dead
//! leader's files; the API server is the one place both replicas reach.
//! Why a journal read back into SQLite and not a store of its own over
//! objects: every query (what is done, the last record) stays the one
//! the CLI runs. ConfigMaps, not Secrets: nothing in it is secret (logs
//! are redacted, records hold no login, pins are public keys).
//!
//! One writer: each leader writes chunks of its own, numbered after the
//! last one it read, and never appends to another's; a replaced leader
//! that writes on is fenced when it makes its next chunk (the number is
//! taken). What it wrote into its own chunk meanwhile is true of the
//! hosts, and a later leader replays it before the chunks of the leader
//! that replaced it.
//!
//! Size: one object holds at most about 1 MiB, so the journal is chunks
//! (`kubexm-state-00001`, ...) of at most `Limits::chunk` bytes of
//! entries; an entry larger than `Limits::piece` is written in parts
//! (the format: kubexm-engine's `journal`).
//! Each append is one merge patch of the current chunk (the API server
//! rewrites the chunk, so chunks stay small). The journal keeps the last
//! 4 KiB of a failed step's log and drops the others'
//! (the working copy keeps them while its leader runs): 5,000 hosts × 60
//! steps is then tens of MB of journal, not gigabytes.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kubexm_installer::engine::journal::{Chunk, Entry, LABEL, Limits, PREFIX, chunk_name, entry_key, pieces, replay};
use kubexm_installer::engine::ssh::KnownHosts;
use kubexm_installer::engine::state::{JobRecord, Record, Span, State, StateError, StepRecord};
use kubexm_installer::engine::store::Store;

/// Where the next entry goes.
#[derive(Debug, Default)]
struct Cursor {
    /// The last chunk's number (0: none yet) and the bytes this leader
    /// wrote in it (`usize::MAX` until it made one: it never writes in
    /// another leader's).
    chunk: u32,
    size: usize,
    /// The next entry's number.
    next: u64,
}

/// The state database's working copy, journaled into ConfigMaps.
pub struct Journaled {
    db: State,
    api: Api<ConfigMap>,
    namespace: String,
    limits: Limits,
    cursor: tokio::sync::Mutex<Cursor>,
    /// Pins put by the engine (a synchronous call), appended with the next write.
    pending: std::sync::Mutex<Vec<Entry>>,
}

impl Journaled {
    /// Reads the journal in `namespace` into a new working copy at `path`
    /// (whatever was there is replaced); `secrets` are redacted from logs.
    pub async fn open(
        client: kube::Client,
        namespace: &str,
        path: &Path,
        secrets: Vec<String>,
        limits: Limits,
    ) -> Result<Journaled, String> {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            match std::fs::remove_file(PathBuf::from(&p)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("the working copy {}: {e}", PathBuf::from(p).display())),
            }
        }
        let db = State::open(path, secrets).map_err(|e| e.to_string())?;
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let chunks = read_chunks(&api, namespace).await?;
        let mut cursor = Cursor::default();
        let mut entries = Vec::new();
        for (n, (name, data)) in chunks {
            cursor.chunk = n;
            for (key, value) in data {
                let number: u64 = key.strip_prefix('e').and_then(|k| k.parse().ok()).ok_or_else(|| {
                    format!("the ConfigMap {namespace}/{name} has a key {key:?} that is no journal entry: delete the key or the ConfigMap")
                })?;
                cursor.next = cursor.next.max(number + 1);
                let entry: Entry =
                    serde_json::from_str(&value).map_err(|e| format!("the ConfigMap {namespace}/{name}, entry {key}: {e}"))?;
                entries.push(entry);
            }
        }
        replay(&db, entries)?;
        // This leader's first write makes a chunk of its own.
        cursor.size = usize::MAX;
        Ok(Journaled {
            db,
            api,
            namespace: namespace.to_string(),
            limits,
            cursor: tokio::sync::Mutex::new(cursor),
            pending: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The working copy (reads, and what the engine's synchronous parts use).
    pub fn db(&self) -> &State {
        &self.db
    }

    /// Pins `key` for `endpoint`, in the working copy and the journal.
    pub async fn pin(&self, endpoint: &str, key: &str) -> Result<(), StateError> {
        self.db.put(endpoint, key);
        self.append(Entry::Pin {
            endpoint: endpoint.into(),
            key: key.into(),
        })
        .await
    }

    /// Appends `entry` (and the pins put meanwhile) to the journal.
    async fn append(&self, entry: Entry) -> Result<(), StateError> {
        let mut entries = self.pending.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default();
        entries.push(entry);
        let mut cursor = self.cursor.lock().await;
        for entry in entries {
            for piece in pieces(&entry, self.limits.piece).map_err(|e| self.error(&cursor, &e))? {
                self.write(&mut cursor, piece).await?;
            }
        }
        Ok(())
    }

    /// Writes one piece into the current chunk, or a new one when it is
    /// full or another leader's. A chunk of that number made meanwhile is
    /// another leader's: this one is fenced.
    async fn write(&self, cursor: &mut Cursor, piece: String) -> Result<(), StateError> {
        let len = piece.len();
        let data = BTreeMap::from([(entry_key(cursor.next), piece)]);
        if cursor.size.saturating_add(len) > self.limits.chunk {
            let name = chunk_name(cursor.chunk + 1);
            let chunk = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.namespace.clone()),
                    labels: Some(BTreeMap::from([
                        (LABEL.to_string(), "journal".to_string()),
                        ("app.kubernetes.io/part-of".to_string(), "kubexm".to_string()),
                    ])),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            match self.api.create(&PostParams::default(), &chunk).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Err(StateError::elsewhere(
                        &format!("journal ConfigMap {}/{name}", self.namespace),
                        "another leader made it: this replica no longer leads, and stops writing",
                    ));
                }
                Err(e) => {
                    return Err(StateError::elsewhere(
                        &format!("journal ConfigMap {}/{name}", self.namespace),
                        &e.to_string(),
                    ));
                }
            }
            cursor.chunk += 1;
            cursor.size = 0;
        } else {
            let patch = ConfigMap {
                data: Some(data),
                ..Default::default()
            };
            self.api
                .patch(&chunk_name(cursor.chunk), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| self.error(cursor, &e.to_string()))?;
        }
        cursor.size += len;
        cursor.next += 1;
        Ok(())
    }

    fn error(&self, cursor: &Cursor, message: &str) -> StateError {
        StateError::elsewhere(
            &format!("journal ConfigMap {}/{}", self.namespace, chunk_name(cursor.chunk.max(1))),
            message,
        )
    }

    /// The job `id` as an entry.
    fn job_entry(&self, id: i64) -> Result<Entry, StateError> {
        let job = self
            .db
            .job(Some(id))?
            .ok_or_else(|| StateError::elsewhere("the working copy", &format!("job {id} is not there")))?;
        Ok(Entry::Job(job))
    }
}

/// Every chunk of the journal in `namespace`, by number, with its entries
/// (keys sort as written).
async fn read_chunks(api: &Api<ConfigMap>, namespace: &str) -> Result<BTreeMap<u32, Chunk>, String> {
    let mut chunks = BTreeMap::new();
    let mut params = ListParams::default().labels(&format!("{LABEL}=journal")).limit(16);
    loop {
        let list = api
            .list(&params)
            .await
            .map_err(|e| format!("the journal's ConfigMaps in {namespace} cannot be listed: {e}"))?;
        for c in list.items {
            let name = c.metadata.name.unwrap_or_default();
            let n: u32 = name
                .strip_prefix(PREFIX)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("the ConfigMap {namespace}/{name} has the label {LABEL}=journal but is no chunk of it"))?;
            chunks.insert(n, (name, c.data.unwrap_or_default()));
        }
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => break,
        }
    }
    Ok(chunks)
}

impl KnownHosts for Journaled {
    fn get(&self, endpoint: &str) -> Option<String> {
        self.db.get(endpoint)
    }

    fn put(&self, endpoint: &str, key: &str) {
        self.db.put(endpoint, key);
        if let Ok(mut p) = self.pending.lock() {
            p.push(Entry::Pin {
                endpoint: endpoint.into(),
                key: key.into(),
            });
        }
    }
}

impl Store for Journaled {
    fn begin_job<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<i64, StateError>> {
        Box::pin(async move {
            let id = self.db.begin_job(cluster, kind)?;
            self.append(self.job_entry(id)?).await?;
            Ok(id)
        })
    }
    fn finish_job<'a>(&'a self, job: i64, status: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.db.finish_job(job, status)?;
            self.append(self.job_entry(job)?).await
        })
    }
    fn record_many<'a>(&'a self, job: i64, records: &'a [Record<'a>]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.db.record_many(job, records)?;
            self.append(Entry::steps(job, records, |l| self.db.redact(l))).await
        })
    }
    fn record_spans<'a>(&'a self, job: i64, spans: &'a [Span]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.db.record_spans(job, spans)?;
            self.append(Entry::Spans {
                job,
                spans: spans.to_vec(),
            })
            .await
        })
    }
    fn spans(&self, job: i64) -> BoxFuture<'_, Result<Vec<Span>, StateError>> {
        Box::pin(async move { self.db.spans(job) })
    }
    fn done_nodes<'a>(&'a self, cluster: &'a str, job: i64) -> BoxFuture<'a, Result<HashSet<String>, StateError>> {
        Box::pin(async move { self.db.done_nodes(cluster, job) })
    }
    fn done_steps<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<HashSet<String>, StateError>> {
        Box::pin(async move { self.db.done_steps(cluster, kind) })
    }
    fn job(&self, id: Option<i64>) -> BoxFuture<'_, Result<Option<JobRecord>, StateError>> {
        Box::pin(async move { self.db.job(id) })
    }
    fn last_job<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<Option<JobRecord>, StateError>> {
        Box::pin(async move { self.db.last_job(cluster, kind) })
    }
    fn steps(&self, job: i64) -> BoxFuture<'_, Result<Vec<StepRecord>, StateError>> {
        Box::pin(async move { self.db.steps(job) })
    }
    fn step_times(&self, job: i64) -> BoxFuture<'_, Result<Vec<StepRecord>, StateError>> {
        Box::pin(async move { self.db.step_times(job) })
    }
    fn redact(&self, log: &str) -> String {
        self.db.redact(log)
    }
    fn put_record<'a>(&'a self, job: i64, cluster: &'a str, status: &'a str, body: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.db.put_record(job, cluster, status, body)?;
            self.append(Entry::Record {
                job,
                cluster: cluster.into(),
                status: status.into(),
                body: body.into(),
            })
            .await
        })
    }
    fn put_removed<'a>(&'a self, job: i64, cluster: &'a str, hosts: &'a [String]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.db.put_removed(job, cluster, hosts)?;
            self.append(Entry::Removed {
                job,
                cluster: cluster.into(),
                hosts: hosts.to_vec(),
            })
            .await
        })
    }
    fn forget_cluster<'a>(&'a self, cluster: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.db.forget_cluster(cluster)?;
            self.append(Entry::Forget { cluster: cluster.into() }).await
        })
    }
    fn last_record<'a>(&'a self, cluster: &'a str, succeeded: bool) -> BoxFuture<'a, Result<Option<(i64, String)>, StateError>> {
        Box::pin(async move { self.db.last_record(cluster, succeeded) })
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
