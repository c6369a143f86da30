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
//! One writer: a leader that opens the journal seals its last chunk (an
//! annotation written with the chunk's resourceVersion as read, so the
//! seal fails, and the leader reads again, if the chunk changed since),
//! and writes chunks of its own after it. Every write a leader makes to
//! its own chunk carries the resourceVersion it last saw, and before it
//! makes its next chunk it closes its current one the same way: a
//! replaced leader's next write is refused (409), whatever it is. A writer
//! whose write failed writes nothing more (its working copy may be ahead
//! of the journal): its job fails, and the next leader (or this one, when
//! it opens the journal again) reads the journal as it is.
//!
//! Size: one object holds at most about 1 MiB, so the journal is chunks
//! (`kubexm-state-00001`, ...) of at most `Limits::chunk` bytes of
//! entries; an entry larger than `Limits::piece` is written in parts
//! (the format: kubexm-engine's `journal`).
//! Each append is one merge patch of the current chunk, which the API
//! server writes whole: chunks of 256 KiB write about 128 KiB to etcd an
//! append on average. The journal keeps 4 KiB of a failed step's log
//! (its first and last 2 KiB) and drops the others' (the working copy
//! keeps them while its leader runs): 5,000 hosts × 60 steps is then tens
//! of MB of journal, not gigabytes.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kubexm_installer::engine::journal::{Entry, LABEL, Limits, PREFIX, chunk_name, entry_key, pieces, replay};
use kubexm_installer::engine::ssh::KnownHosts;
use kubexm_installer::engine::state::{JobRecord, Record, Span, State, StateError, StepRecord};
use kubexm_installer::engine::store::Store;

/// The annotation a leader seals the last chunk it read with (its identity).
const SEALED_BY: &str = "kubexm.io/sealed-by";

/// The annotation a leader closes its own full chunk with, before the next.
const CLOSED: &str = "kubexm.io/closed";

/// Where the next entry goes, and whether this writer may still write.
#[derive(Debug, Default)]
struct Cursor {
    /// The last chunk's number (0: none yet).
    chunk: u32,
    /// The bytes this leader wrote in it; `usize::MAX` until it made one
    /// (it never writes in another leader's).
    size: usize,
    /// Its own chunk's resourceVersion as its last write left it.
    version: Option<String>,
    /// The next entry's number.
    next: u64,
    /// Why this writer stopped writing (a write failed or was refused).
    failed: Option<String>,
}

/// The state database's working copy, journaled into ConfigMaps.
pub struct Journaled {
    db: State,
    api: Api<ConfigMap>,
    namespace: String,
    identity: String,
    limits: Limits,
    cursor: tokio::sync::Mutex<Cursor>,
    /// Pins put by the engine (a synchronous call), appended with the next write.
    pending: std::sync::Mutex<Vec<Entry>>,
}

/// An entry's number from its key, `e` and twelve digits.
fn entry_number(key: &str) -> Option<u64> {
    key.strip_prefix('e').filter(|d| d.len() == 12).and_then(|d| d.parse().ok())
}

impl Journaled {
    /// Reads the journal in `namespace` into a new working copy at `path`
    /// (whatever was there is replaced) and seals its last chunk for the
    /// leader `identity`; `secrets` are redacted from logs.
    pub async fn open(
        client: kube::Client,
        namespace: &str,
        identity: &str,
        path: &Path,
        secrets: Vec<String>,
        limits: Limits,
    ) -> Result<Journaled, String> {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        // A chunk written between the read and the seal: read again.
        for _ in 0..5 {
            let db = new_working_copy(path, secrets.clone())?;
            let chunks = read_chunks(&api, namespace).await?;
            let cursor = read_into(&db, namespace, &chunks)?;
            if let Some((_, (name, _, version))) = chunks.last_key_value() {
                let seal = sealed(identity, version.clone());
                match api.patch(name, &PatchParams::default(), &Patch::Merge(&seal)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(format!("the journal's ConfigMap {namespace}/{name} cannot be sealed: {e}")),
                }
            }
            return Ok(Journaled {
                db,
                api,
                namespace: namespace.to_string(),
                identity: identity.to_string(),
                limits,
                cursor: tokio::sync::Mutex::new(cursor),
                pending: std::sync::Mutex::new(Vec::new()),
            });
        }
        Err(format!(
            "the journal in {namespace} kept changing while it was read: another replica writes it; check that one leads"
        ))
    }

    /// The working copy (reads, and what the engine's synchronous parts use).
    pub fn db(&self) -> &State {
        &self.db
    }

    /// Pins `key` for `endpoint`, in the working copy and the journal.
    pub async fn pin(&self, endpoint: &str, key: &str) -> Result<(), StateError> {
        self.write_through(
            |db| {
                db.put(endpoint, key);
                Ok(())
            },
            |_, _| {
                Ok(Entry::Pin {
                    endpoint: endpoint.into(),
                    key: key.into(),
                })
            },
        )
        .await
    }

    /// Writes to the working copy and appends what `entry` makes of it to
    /// the journal, under the journal's lock (the journal's order is the
    /// working copy's), unless this writer stopped writing.
    async fn write_through<T>(
        &self,
        write: impl FnOnce(&State) -> Result<T, StateError>,
        entry: impl FnOnce(&State, &T) -> Result<Entry, StateError>,
    ) -> Result<T, StateError> {
        let mut cursor = self.cursor.lock().await;
        if let Some(why) = &cursor.failed {
            return Err(self.refused(&cursor, why));
        }
        let out = write(&self.db)?;
        let mut entries = self.pending.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default();
        entries.push(entry(&self.db, &out)?);
        for e in entries {
            let written = match pieces(&e, self.limits.piece) {
                Ok(pieces) => self.write_pieces(&mut cursor, pieces).await,
                Err(why) => Err(why),
            };
            if let Err(why) = written {
                let err = self.refused(&cursor, &why);
                cursor.failed = Some(why);
                return Err(err);
            }
        }
        Ok(out)
    }

    async fn write_pieces(&self, cursor: &mut Cursor, pieces: Vec<String>) -> Result<(), String> {
        for piece in pieces {
            self.write(cursor, piece).await?;
        }
        Ok(())
    }

    /// Writes one piece into this leader's chunk, or closes it and makes
    /// the next when it is full (or it has none yet).
    async fn write(&self, cursor: &mut Cursor, piece: String) -> Result<(), String> {
        let len = piece.len();
        let next = cursor.next.checked_add(1).ok_or("the journal's entry numbers ran out")?;
        let data = BTreeMap::from([(entry_key(cursor.next), piece)]);
        if cursor.size.saturating_add(len) > self.limits.chunk {
            if let Some(version) = cursor.version.clone() {
                self.patch(cursor.chunk, annotated(CLOSED, &self.identity, Some(version)), cursor)
                    .await?;
            }
            let n = cursor.chunk.checked_add(1).ok_or("the journal's chunk numbers ran out")?;
            let made = self.api.create(&PostParams::default(), &self.chunk(n, data)).await;
            let made = match made {
                Ok(made) => made,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Err(format!(
                        "{} was made by another writer: this replica no longer leads, and stops writing",
                        chunk_name(n)
                    ));
                }
                Err(e) => return Err(format!("{} cannot be made: {e}", chunk_name(n))),
            };
            cursor.chunk = n;
            cursor.size = 0;
            cursor.version = made.metadata.resource_version;
        } else {
            let version = cursor.version.clone().ok_or("no chunk of this writer's to write into")?;
            let patch = ConfigMap {
                metadata: ObjectMeta {
                    resource_version: Some(version),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            self.patch(cursor.chunk, patch, cursor).await?;
        }
        cursor.size += len;
        cursor.next = next;
        Ok(())
    }

    /// Merge-patches chunk `n` of this writer's (the patch carries the
    /// resourceVersion it last saw): a 409 says another leader sealed it.
    async fn patch(&self, n: u32, patch: ConfigMap, cursor: &mut Cursor) -> Result<(), String> {
        match self.api.patch(&chunk_name(n), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(c) => {
                cursor.version = c.metadata.resource_version;
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Err(format!(
                "{} was sealed by another leader: this replica no longer leads, and stops writing",
                chunk_name(n)
            )),
            Err(e) => Err(format!("{} cannot be written: {e}", chunk_name(n))),
        }
    }

    /// A new chunk `n` holding `data`.
    fn chunk(&self, n: u32, data: BTreeMap<String, String>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(chunk_name(n)),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (LABEL.to_string(), "journal".to_string()),
                    ("app.kubernetes.io/part-of".to_string(), "kubexm".to_string()),
                ])),
                annotations: Some(BTreeMap::from([("kubexm.io/writer".to_string(), self.identity.clone())])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    /// The error of a write to the journal that failed or was refused.
    fn refused(&self, cursor: &Cursor, why: &str) -> StateError {
        StateError::elsewhere(
            &format!("the state journal in {}", self.namespace),
            &format!(
                "{why} (at entry {}); the job stops here, and a leader that reads the journal again resumes it. If the                  journal cannot be written, check the controller's RBAC for ConfigMaps in {}",
                entry_key(cursor.next),
                self.namespace
            ),
        )
    }

    /// The job `id` as an entry.
    fn job_entry(db: &State, id: i64) -> Result<Entry, StateError> {
        let job = db
            .job(Some(id))?
            .ok_or_else(|| StateError::elsewhere("the working copy", &format!("job {id} is not there")))?;
        Ok(Entry::Job(job))
    }
}

/// A new working copy at `path` (whatever was there removed).
fn new_working_copy(path: &Path, secrets: Vec<String>) -> Result<State, String> {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("the working copy {}: {e}", p.display())),
        }
    }
    State::open(path, secrets).map_err(|e| e.to_string())
}

/// `chunks` read into `db`; where the next entry goes.
fn read_into(db: &State, namespace: &str, chunks: &BTreeMap<u32, ReadChunk>) -> Result<Cursor, String> {
    let mut cursor = Cursor {
        // This leader's first write makes a chunk of its own.
        size: usize::MAX,
        ..Default::default()
    };
    let mut entries = Vec::new();
    for (n, (name, data, _)) in chunks {
        cursor.chunk = *n;
        for (key, value) in data {
            let number = entry_number(key).ok_or_else(|| {
                format!("the ConfigMap {namespace}/{name} has a key {key:?} that is no journal entry: delete the key or the ConfigMap")
            })?;
            cursor.next = cursor.next.max(number.saturating_add(1));
            let entry: Entry = serde_json::from_str(value).map_err(|e| format!("the ConfigMap {namespace}/{name}, entry {key}: {e}"))?;
            entries.push((format!("the ConfigMap {namespace}/{name}, entry {key}"), entry));
        }
    }
    replay(db, entries)?;
    Ok(cursor)
}

/// A patch that annotates a chunk read at `version` with `key: identity`.
fn annotated(key: &str, identity: &str, version: Option<String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            resource_version: version,
            annotations: Some(BTreeMap::from([(key.to_string(), identity.to_string())])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The seal of the last chunk read at `version`.
fn sealed(identity: &str, version: Option<String>) -> ConfigMap {
    annotated(SEALED_BY, identity, version)
}

/// A chunk as read: its name, entries by key and resourceVersion.
type ReadChunk = (String, BTreeMap<String, String>, Option<String>);

/// Every chunk of the journal in `namespace`, by number (keys sort as
/// written). A labelled ConfigMap whose name is not exactly a chunk's is
/// refused, naming it.
async fn read_chunks(api: &Api<ConfigMap>, namespace: &str) -> Result<BTreeMap<u32, ReadChunk>, String> {
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
                .filter(|n| chunk_name(*n) == name)
                .ok_or_else(|| format!("the ConfigMap {namespace}/{name} has the label {LABEL}=journal but is no chunk of it"))?;
            chunks.insert(n, (name, c.data.unwrap_or_default(), c.metadata.resource_version));
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

    /// The engine's pin on first contact (the controller never pins on
    /// first use: [`Journaled::pin`] is its own): in the working copy now,
    /// in the journal with the next write.
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
        Box::pin(self.write_through(move |db| db.begin_job(cluster, kind), |db, id| Self::job_entry(db, *id)))
    }
    fn finish_job<'a>(&'a self, job: i64, status: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.write_through(move |db| db.finish_job(job, status), move |db, _| Self::job_entry(db, job)))
    }
    fn record_many<'a>(&'a self, job: i64, records: &'a [Record<'a>]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.write_through(
            move |db| db.record_many(job, records),
            move |db, _| Ok(Entry::steps(job, records, |l| db.redact(l))),
        ))
    }
    fn record_spans<'a>(&'a self, job: i64, spans: &'a [Span]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.write_through(
            move |db| db.record_spans(job, spans),
            move |_, _| {
                Ok(Entry::Spans {
                    job,
                    spans: spans.to_vec(),
                })
            },
        ))
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
        Box::pin(self.write_through(
            move |db| db.put_record(job, cluster, status, body),
            move |_, _| {
                Ok(Entry::Record {
                    job,
                    cluster: cluster.into(),
                    status: status.into(),
                    body: body.into(),
                })
            },
        ))
    }
    fn put_removed<'a>(&'a self, job: i64, cluster: &'a str, hosts: &'a [String]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.write_through(
            move |db| db.put_removed(job, cluster, hosts),
            move |_, _| {
                Ok(Entry::Removed {
                    job,
                    cluster: cluster.into(),
                    hosts: hosts.to_vec(),
                })
            },
        ))
    }
    fn forget_cluster<'a>(&'a self, cluster: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.write_through(
            move |db| db.forget_cluster(cluster),
            move |_, _| Ok(Entry::Forget { cluster: cluster.into() }),
        ))
    }
    fn last_record<'a>(&'a self, cluster: &'a str, succeeded: bool) -> BoxFuture<'a, Result<Option<(i64, String)>, StateError>> {
        Box::pin(async move { self.db.last_record(cluster, succeeded) })
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
