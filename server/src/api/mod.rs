//! `kubexm api-server`: the job operations over HTTPS for automation (a
//! CMDB, a portal, CI). A request is validated and stored as a job, or
//! refused with every error and its line:column, storing nothing; the jobs,
//! their status and their log lines (server-sent events, resumable from a
//! sequence number) are read from the job database the workers write.
//! Clients authenticate with a bearer token (only its sha256 is stored) or
//! a client certificate from the server's CA ([`tls`]). The OpenAPI document
//! it serves is the one committed in `manifests/api/openapi.json`.

mod hosts_jobs;
pub mod tls;

/// The connection limits, shared with the bundle registry.
pub use kubexm_installer::limits;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;

use crate::bundles;
use crate::jobdb::{JobDb, LogLine, Scope};
use crate::ops::{self, CreateError};
use kubexm_installer::ops::request::{ApplyRequest, InstallRequest, Request as OpRequest};
use tls::ClientCertificate;

/// The OpenAPI document of this API, as committed.
pub const OPENAPI: &str = include_str!("../../../manifests/api/openapi.json");

/// The port the API listens on unless told otherwise.
pub const PORT: u16 = 8443;

/// How the API server runs.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    pub listen: SocketAddr,
    /// CA, server certificate and key (made on first start).
    pub tls_dir: PathBuf,
    /// Names and addresses the server certificate covers.
    pub names: Vec<String>,
    /// The bundles jobs may name by digest (a request is validated against
    /// its bundle's catalog; the claiming worker installs from its own copy).
    pub bundles: PathBuf,
    /// Connections open at once; one more is closed at once.
    pub max_connections: usize,
    /// A plain-HTTP listener (loopback) serving only `/healthz` and
    /// `/readyz`, outside the connection cap: a health check always has room.
    pub health_listen: Option<SocketAddr>,
    /// The embedded worker's state, when there is one.
    pub worker: Option<Arc<crate::worker::WorkerHealth>>,
    /// Mutating requests a principal may make per minute after a burst of
    /// [`POST_BURST`] (0: no limit); one more answers 429.
    pub post_rate: u32,
    /// The installer's state root on this machine (the embedded worker's):
    /// clusters installed there outside the API are not bound to a request.
    pub root: Option<PathBuf>,
}

/// Mutating requests per principal and minute unless told otherwise.
pub const POST_RATE: u32 = 60;
/// The burst a principal may send before the rate applies.
pub const POST_BURST: f64 = 20.0;
/// Unauthenticated refusals audited a minute, after the same burst.
const ANON_AUDIT_RATE: u32 = 60;

struct App {
    db: Arc<JobDb>,
    o: ApiOptions,
    /// The catalog each bundle carries, read once.
    catalogs: Mutex<HashMap<PathBuf, Arc<kubexm_bom::catalog::Catalog>>>,
    /// Validations running at once: one per core. More only switch threads
    /// and fight over the allocator, which shows as tail latency.
    validating: tokio::sync::Semaphore,
    /// Each principal's bucket of mutating requests: (left, when counted).
    buckets: Mutex<HashMap<String, (f64, std::time::Instant)>>,
}

/// An error answer: `{"error": "..."}` with its status.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.0, axum::Json(json!({"error": self.1}))).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        r
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!("{e}");
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// Runs `f` (a config's validation: CPU work) off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

impl App {
    /// Takes one request from `key`'s bucket ([`POST_BURST`], refilled at
    /// `per_minute`; 0: unlimited); false when it is empty.
    fn take(&self, key: &str, per_minute: u32) -> bool {
        if per_minute == 0 {
            return true;
        }
        let per_sec = f64::from(per_minute) / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let (left, at) = buckets.entry(key.to_string()).or_insert((POST_BURST, now));
        *left = (*left + at.elapsed().as_secs_f64() * per_sec).min(POST_BURST);
        *at = now;
        if *left >= 1.0 {
            *left -= 1.0;
            true
        } else {
            false
        }
    }

    fn new(db: Arc<JobDb>, o: ApiOptions) -> App {
        App {
            db,
            o,
            catalogs: Mutex::new(HashMap::new()),
            validating: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())),
            buckets: Mutex::new(HashMap::new()),
        }
    }
}

/// The API's routes over `db`.
pub fn router(db: Arc<JobDb>, o: ApiOptions) -> Router {
    let app = Arc::new(App::new(db, o));
    let guarded = Router::new()
        .route("/api/v1/clusters", post(create_cluster::<false>))
        .route("/api/v1/clusters/apply", post(create_cluster::<true>))
        .route("/api/v1/clusters/upgrade", post(create_upgrade))
        .route("/api/v1/clusters/facts", post(hosts_jobs::create_facts))
        .route("/api/v1/clusters/reset", post(hosts_jobs::create_reset))
        .route("/api/v1/clusters/etcd-snapshot", post(hosts_jobs::create_etcd_snapshot))
        .route("/api/v1/clusters/remove-node", post(hosts_jobs::create_remove_node))
        .route("/api/v1/clusters/delete", post(hosts_jobs::create_delete))
        .route("/api/v1/clusters/certs-check", post(hosts_jobs::create_certs_check))
        .route("/api/v1/clusters/certs-renew", post(hosts_jobs::create_certs_renew))
        .route("/api/v1/clusters/etcd-restore", post(hosts_jobs::create_etcd_restore))
        .route("/api/v1/jobs", get(jobs))
        .route("/api/v1/jobs/{id}", get(job))
        .route("/api/v1/jobs/{id}/logs", get(logs))
        .route("/api/v1/jobs/{id}/timeline", get(timeline))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .layer(axum::middleware::from_fn_with_state(app.clone(), authenticate))
        .layer(DefaultBodyLimit::max(kubexm_bom::config::MAX_CONFIG_BYTES as usize + 1));
    Router::new()
        .merge(health_routes(app.clone()))
        .route("/api/v1/openapi.json", get(openapi))
        .merge(guarded)
        .with_state(app)
}

/// `/healthz` (liveness: always 200, with the database's and the embedded
/// worker's state) and `/readyz` (503 when jobs cannot run: the database
/// does not answer, or the embedded worker is restarting).
fn health_routes<S: Clone + Send + Sync + 'static>(app: Arc<App>) -> Router<S> {
    let check = |app: Arc<App>| async move {
        let database = match app.db.ping().await {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {}", crate::text::line(&e.to_string())),
        };
        let (worker, error) = match &app.o.worker {
            None => ("none".to_string(), None),
            Some(w) => {
                let (running, error) = w.state();
                ((if running { "running" } else { "restarting" }).to_string(), error)
            }
        };
        let ready = database == "ok" && worker != "restarting";
        (
            ready,
            json!({"status": if ready { "ok" } else { "degraded" }, "database": database, "worker": worker, "workerError": error}),
        )
    };
    let (a, b) = (app.clone(), app);
    Router::new()
        .route(
            "/healthz",
            get(move || {
                let app = a.clone();
                async move { axum::Json(check(app).await.1) }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let app = b.clone();
                async move {
                    let (ready, body) = check(app).await;
                    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    (status, axum::Json(body))
                }
            }),
        )
}

/// Serves the API on `o.listen` over TLS until `handle` is shut down
/// (`handle.listening()` gives the address once bound).
pub async fn serve(db: Arc<JobDb>, o: ApiOptions, handle: axum_server::Handle<SocketAddr>) -> anyhow::Result<()> {
    let t = tls::server(&o.tls_dir, &o.names)?;
    let listen = o.listen;
    let limits = limits::Limits::new(o.max_connections, limits::IDLE);
    if let Some(h) = o.health_listen {
        let health = health_routes(Arc::new(App::new(db.clone(), o.clone())));
        let listener = tokio::net::TcpListener::bind(h)
            .await
            .map_err(|e| anyhow::anyhow!("the health listener on {h}: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, health).await {
                tracing::error!("the health listener on {h}: {e}");
            }
        });
    }
    // The kernel's queue of connections not yet accepted holds as many as
    // the cap (a burst never sits unaccepted, neither counted nor refused).
    let listener = limits::listener(listen, o.max_connections).map_err(|e| anyhow::anyhow!("the API server on {listen}: {e}"))?;
    let mut server = axum_server::from_tcp(listener)?
        .acceptor(tls::Acceptor::new(t.config, limits))
        .handle(handle);
    // A request head must arrive within 10 s (hyper's timer); an idle
    // connection is closed by the acceptor's limits.
    limits::http1_timeouts(&mut server);
    server
        .serve(router(db, o).into_make_service())
        .await
        .map_err(|e| anyhow::anyhow!("the API server on {listen}: {e}"))
}

/// Who made a request, and what they may do.
#[derive(Debug, Clone)]
pub struct Principal {
    /// `token:NAME#ID` or `cert:NAME`: recorded on the jobs it creates and in the audit log.
    pub name: String,
    pub scopes: Vec<Scope>,
}

impl Principal {
    fn allows(&self, needed: Scope) -> bool {
        self.scopes.contains(&needed) || self.scopes.contains(&Scope::Admin)
    }

    fn requester<'a>(&'a self, root: Option<&'a std::path::Path>) -> ops::Requester<'a> {
        ops::Requester {
            name: &self.name,
            admin: self.scopes.contains(&Scope::Admin),
            root,
        }
    }
}

/// The scope a route needs.
fn needed(method: &axum::http::Method, path: &str) -> Scope {
    match (method.as_str(), path) {
        ("GET", _) => Scope::Read,
        // A removal resets the hosts it takes out; a delete, every host.
        (
            "POST",
            "/api/v1/clusters/reset"
            | "/api/v1/clusters/remove-node"
            | "/api/v1/clusters/delete"
            | "/api/v1/clusters/certs-renew"
            | "/api/v1/clusters/etcd-restore",
        ) => Scope::Reset,
        _ => Scope::Create,
    }
}

/// The job a response created (set by [`created`]), for the audit log.
#[derive(Clone, Copy)]
struct CreatedJob(i64);

/// Authenticates (a client certificate not revoked, or a bearer token
/// neither revoked nor expired, looked up on every request), checks the
/// route's scope, and appends every mutating request and every refusal to
/// the audit log.
async fn authenticate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let cert = req.extensions().get::<ClientCertificate>().and_then(|c| c.0.clone());
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let who = identify(&app, cert, bearer).await;
    let audit = |principal: String, job: Option<i64>, status: StatusCode| {
        let (db, method, path) = (app.db.clone(), method.to_string(), path.clone());
        async move {
            if let Err(e) = db.audit(&principal, &method, &path, job, status.as_u16()).await {
                tracing::error!("the audit log could not be written: {e}");
            }
        }
    };
    let p = match who {
        Ok(p) => p,
        Err(e) => {
            // Refusals of unauthenticated requests are audited up to a
            // budget: a flood cannot grow the database or hold its lock.
            if app.take("-", ANON_AUDIT_RATE) {
                audit("-".into(), None, e.0).await;
            }
            return e.into_response();
        }
    };
    let scope = needed(&method, &path);
    if !p.allows(scope) {
        audit(p.name.clone(), None, StatusCode::FORBIDDEN).await;
        return ApiError(
            StatusCode::FORBIDDEN,
            format!("{} may not do this: it needs the `{}` scope", p.name, scope.as_str()),
        )
        .into_response();
    }
    if method != axum::http::Method::GET && !app.take(&p.name, app.o.post_rate) {
        audit(p.name.clone(), None, StatusCode::TOO_MANY_REQUESTS).await;
        let mut r = ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{} sent more than {} changing requests a minute; wait and send again",
                p.name, app.o.post_rate
            ),
        )
        .into_response();
        r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
        return r;
    }
    req.extensions_mut().insert(p.clone());
    let resp = next.run(req).await;
    if method != axum::http::Method::GET {
        let job = resp.extensions().get::<CreatedJob>().map(|j| j.0).or_else(|| {
            path.strip_prefix("/api/v1/jobs/")
                .and_then(|r| r.split('/').next())
                .and_then(|id| id.parse().ok())
        });
        audit(p.name, job, resp.status()).await;
    }
    resp
}

/// The principal of a request, or the 401 to answer.
async fn identify(app: &Arc<App>, cert: Option<tls::CertIdentity>, bearer: Option<String>) -> Result<Principal, ApiError> {
    let unauthorized = |m: &str| ApiError(StatusCode::UNAUTHORIZED, m.to_string());
    if let Some(c) = cert {
        if app.db.cert_revoked(&c.fingerprint).await.map_err(internal)? {
            return Err(unauthorized("this client certificate is revoked"));
        }
        return Ok(Principal {
            name: format!("cert:{}", c.name),
            scopes: c.scopes,
        });
    }
    let token = bearer.ok_or_else(|| {
            unauthorized(
                "no credentials: send `Authorization: Bearer <token>` (`kubexm token create` makes one) or a client certificate from this server's CA",
            )
        })?;
    match app.db.token(&token).await.map_err(internal)? {
        Some(t) if t.valid(crate::jobdb::now_ms()) => Ok(Principal {
            name: format!("token:{}#{}", t.name, t.id),
            scopes: t.scopes,
        }),
        Some(t) if t.revoked.is_some() => Err(unauthorized("this token is revoked")),
        Some(_) => Err(unauthorized("this token has expired: `kubexm token create --ttl` makes a new one")),
        None => Err(unauthorized("unknown token")),
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

#[derive(Deserialize)]
struct CreateQuery {
    /// `sha256:<hex>` of a bundle held; optional when exactly one is.
    bundle: Option<String>,
}

/// `POST /api/v1/clusters` (an install) and, with `APPLY`, `POST
/// /api/v1/clusters/apply` (an apply of the installed cluster: `kubexm
/// scale`).
async fn create_cluster<const APPLY: bool>(
    State(app): State<Arc<App>>,
    Query(q): Query<CreateQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    bundle_job(app, q, who, headers, body, |bundle| {
        if APPLY {
            OpRequest::Apply(ApplyRequest { bundle })
        } else {
            OpRequest::Install(InstallRequest {
                bundle,
                phases: Vec::new(),
            })
        }
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UpgradeQuery {
    /// `sha256:<hex>` of the target's bundle; optional when exactly one is held.
    bundle: Option<String>,
    /// NotReady workers to leave at their version, comma-separated.
    skip_not_ready: Option<String>,
    /// Each drain's time limit in seconds (over the config's).
    drain_timeout: Option<u32>,
}

/// `POST /api/v1/clusters/upgrade`: an upgrade of the installed cluster to
/// the version the body names, from the held bundle built for it (`kubexm
/// upgrade cluster`); the hosts named to skip are the config's.
async fn create_upgrade(
    State(app): State<Arc<App>>,
    Query(q): Query<UpgradeQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if q.drain_timeout == Some(0) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "drainTimeout must be at least 1 (seconds); nothing was stored".into(),
        ));
    }
    let skip_not_ready = q.skip_not_ready.as_deref().map(hosts_jobs::names).unwrap_or_default();
    let drain_timeout = q.drain_timeout;
    let q = CreateQuery { bundle: q.bundle };
    bundle_job(app, q, who, headers, body, |bundle| {
        OpRequest::Upgrade(kubexm_installer::ops::request::UpgradeRequest {
            bundle,
            skip_not_ready,
            drain_timeout,
        })
    })
    .await
}

/// Stores the job `make` asks of a held bundle (the one named, or the only
/// one), the body validated against its catalog; the hosts the request
/// names are the config's, or nothing is stored.
async fn bundle_job(
    app: Arc<App>,
    q: CreateQuery,
    who: Principal,
    headers: HeaderMap,
    body: Bytes,
    make: impl FnOnce(String) -> OpRequest,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    let _turn = app.validating.acquire().await.map_err(internal)?;
    let a = app.clone();
    let (cluster, text, digest) = blocking(move || {
        let app = a;
        let bad = |m: String| ApiError(StatusCode::BAD_REQUEST, m);
        let digest = match q.bundle {
            Some(d) => d,
            None => {
                let held = bundles::list(&app.o.bundles).map_err(internal)?;
                match held.as_slice() {
                    [one] => one.clone(),
                    [] => {
                        return Err(bad(format!(
                            "no bundle is held in {}: add one with `kubexm bundle add FILE --pubkey KEY`",
                            app.o.bundles.display()
                        )));
                    }
                    _ => {
                        return Err(bad(format!(
                            "{} bundles are held: name one with ?bundle=sha256:... (`kubexm bundle list`)",
                            held.len()
                        )));
                    }
                }
            }
        };
        let bundle = bundles::find(&app.o.bundles, &digest).map_err(|e| bad(e.to_string()))?;
        let catalog = app.catalog(&bundle)?;
        let text = utf8(&body)?;
        Ok((ops::validate_text(&text, "cluster.yaml", Some(&catalog)), text, digest))
    })
    .await?;
    let request = make(digest);
    if let Ok(c) = &cluster
        && let Err(e) = kubexm_installer::ops::session::check_hosts(c, &request.named_hosts())
    {
        return Err(ApiError(StatusCode::BAD_REQUEST, format!("{e:#}; nothing was stored")));
    }
    store_validated(&app, cluster, &text, &request, who).await
}

/// A request body is cluster.yaml as `application/yaml` or `application/json`.
fn body_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let t = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
    match t.as_deref() {
        Some("application/yaml" | "application/json") => Ok(()),
        _ => Err(ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send cluster.yaml with `Content-Type: application/yaml` (or application/json)".into(),
        )),
    }
}

/// The config text of a request body.
fn utf8(body: &Bytes) -> Result<String, ApiError> {
    String::from_utf8(body.to_vec()).map_err(|e| {
        ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the body is not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// 202 with the job's id, or 422 with every validation error.
fn created(r: Result<i64, CreateError>) -> Result<Response, ApiError> {
    match r {
        Ok(id) => {
            let mut r = (StatusCode::ACCEPTED, axum::Json(json!({"job_id": id}))).into_response();
            r.extensions_mut().insert(CreatedJob(id));
            Ok(r)
        }
        Err(CreateError::Invalid(kubexm_bom::config::LoadError::Invalid(d))) => Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"error": d.to_string(), "file": d.file, "errors": d.diagnostics, "more": d.more})),
        )
            .into_response()),
        Err(CreateError::Invalid(e)) => Err(ApiError(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())),
        Err(CreateError::Conflict(why)) => Err(ApiError(StatusCode::CONFLICT, why)),
        Err(CreateError::Store(e)) => Err(internal(format!("{e:#}"))),
    }
}

/// Stores a job asking `request` of the body's config once it validated
/// (`422` with the errors when it did not).
async fn store_validated(
    app: &App,
    cluster: Result<kubexm_bom::config::Cluster, CreateError>,
    text: &str,
    request: &OpRequest,
    who: Principal,
) -> Result<Response, ApiError> {
    let cluster = match cluster {
        Ok(c) => c,
        Err(e) => return created(Err(e)),
    };
    let who = who.requester(app.o.root.as_deref());
    created(ops::create_job_text(&app.db, &cluster, text, "cluster.yaml", request, who).await)
}

impl App {
    fn catalog(&self, bundle: &std::path::Path) -> Result<Arc<kubexm_bom::catalog::Catalog>, ApiError> {
        if let Some(c) = self.catalogs.lock().unwrap_or_else(|e| e.into_inner()).get(bundle) {
            return Ok(c.clone());
        }
        let m = kubexm_bundle::verify::read_manifest(bundle).map_err(internal)?;
        let c = Arc::new(kubexm_installer::ops::lock_catalog(&m, bundle).map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("{e:#}")))?);
        self.catalogs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(bundle.to_path_buf(), c.clone());
        Ok(c)
    }
}

fn not_found(id: i64) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no job {id}"))
}

async fn jobs(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let jobs = app.db.list().await.map_err(internal)?;
    Ok(axum::Json(json!({"jobs": jobs})).into_response())
}

async fn job(State(app): State<Arc<App>>, UrlPath(id): UrlPath<i64>) -> Result<Response, ApiError> {
    let j = app.db.get(id).await.map_err(internal)?.ok_or(not_found(id))?;
    Ok(axum::Json(j).into_response())
}

#[derive(Deserialize)]
struct TimelineQuery {
    format: Option<String>,
}

/// Where a job's time went, as the worker stored it when its run ended:
/// JSON, or with `format=svg` the picture (served so that a browser runs
/// nothing in it: every text in it is escaped, and no script may load).
async fn timeline(State(app): State<Arc<App>>, UrlPath(id): UrlPath<i64>, Query(q): Query<TimelineQuery>) -> Result<Response, ApiError> {
    let svg = match q.format.as_deref() {
        None | Some("json") => false,
        Some("svg") => true,
        Some(_) => return Err(ApiError(StatusCode::BAD_REQUEST, "format: json or svg".into())),
    };
    app.db.get(id).await.map_err(internal)?.ok_or(not_found(id))?;
    let Some(t) = app.db.timeline(id).await.map_err(internal)? else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("job {id} has no timeline yet: it has not run, or is running; its log says how far it is"),
        ));
    };
    if !svg {
        return Ok(axum::Json(t).into_response());
    }
    let headers = [
        (axum::http::header::CONTENT_TYPE, "image/svg+xml"),
        (
            axum::http::header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'",
        ),
        (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    Ok((headers, kubexm_engine::timeline::svg::render(&t)).into_response())
}

async fn cancel(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<i64>,
    Extension(who): Extension<Principal>,
) -> Result<Response, ApiError> {
    let j = app.db.get(id).await.map_err(internal)?.ok_or(not_found(id))?;
    // A principal cancels its own jobs (an admin any).
    if !who.scopes.contains(&Scope::Admin) && j.principal.as_deref() != Some(who.name.as_str()) {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "job {id} was created by another principal; {} may cancel only its own jobs",
                who.name
            ),
        ));
    }
    let s = app.db.request_cancel(id).await.map_err(internal)?.ok_or(not_found(id))?;
    Ok(axum::Json(json!({"id": id, "status": s})).into_response())
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    follow: bool,
    /// The last sequence number the client has (0: from the first line).
    from: Option<i64>,
}

/// The log of a job as server-sent events: one event per line (`id` its
/// sequence number, `data` the line), then an `end` event with the job's
/// status once it has ended (with `follow`) or once the lines written so
/// far are sent. A reconnecting client sends `from` (or `Last-Event-ID`).
async fn logs(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<i64>,
    Query(q): Query<LogQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    app.db.get(id).await.map_err(internal)?.ok_or(not_found(id))?;
    if q.from.is_some_and(|f| f < 0) {
        return Err(ApiError(StatusCode::BAD_REQUEST, "from: a log sequence number, 0 or more".into()));
    }
    let from = q.from.or_else(|| {
        headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    });
    struct Cursor {
        db: Arc<JobDb>,
        after: i64,
        queue: std::collections::VecDeque<Event>,
        done: bool,
        follow: bool,
        id: i64,
    }
    let cursor = Cursor {
        db: app.db.clone(),
        after: from.unwrap_or(0).max(0),
        queue: Default::default(),
        done: false,
        follow: q.follow,
        id,
    };
    let stream = futures_util::stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(e) = c.queue.pop_front() {
                return Some((Ok(e), c));
            }
            if c.done {
                return None;
            }
            // The status first: once final, the lines read next are all there are.
            let read = async {
                let j = c.db.get(c.id).await?;
                Ok::<_, crate::jobdb::JobDbError>((j, c.db.logs(c.id, c.after).await?))
            };
            let (j, lines): (_, Vec<LogLine>) = match read.await {
                Ok(r) => r,
                Err(e) => {
                    c.queue.push_back(Event::default().event("error").data(e.to_string()));
                    c.done = true;
                    continue;
                }
            };
            for l in &lines {
                c.queue.push_back(Event::default().id(l.seq.to_string()).data(&l.line));
                c.after = l.seq;
            }
            let status = j.map(|j| j.status);
            if !c.follow || status.is_none_or(|s| s.is_final()) {
                let s = status.map(|s| s.as_str()).unwrap_or("Gone");
                c.queue.push_back(
                    Event::default()
                        .event("end")
                        .data(json!({"status": s, "last": c.after}).to_string()),
                );
                c.done = true;
            } else if lines.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    // A comment every 5 s: a followed log is never idle long enough to be closed.
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(5))))
}
