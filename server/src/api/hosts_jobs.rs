//! The routes that store a job over the hosts of the body's config (facts,
//! reset, etcd snapshot, remove node, delete, certificate check): their queries checked, the
//! config validated without a catalog, the hosts a request names checked
//! against it; nothing is stored when one fails.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::*;

pub(super) async fn create_facts(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    hosts_job(app, body, OpRequest::Facts(Default::default()), who).await
}

#[derive(Deserialize)]
pub(super) struct ResetQuery {
    #[serde(default)]
    confirm: bool,
}

pub(super) async fn create_reset(
    State(app): State<Arc<App>>,
    Query(q): Query<ResetQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    confirm(q.confirm, "a reset deletes the cluster on its hosts, etcd data included")?;
    hosts_job(app, body, OpRequest::Reset(Default::default()), who).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SnapshotQuery {
    keep: Option<u32>,
}

pub(super) async fn create_etcd_snapshot(
    State(app): State<Arc<App>>,
    Query(q): Query<SnapshotQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    if q.keep == Some(0) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "keep must be at least 1 (the snapshot just taken); nothing was stored".into(),
        ));
    }
    let request = OpRequest::EtcdSnapshot(kubexm_installer::ops::request::SnapshotRequest {
        unreachable: vec![],
        keep: q.keep,
    });
    hosts_job(app, body, request, who).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RemoveQuery {
    /// Comma-separated host names.
    hosts: String,
    #[serde(default)]
    unreachable: String,
    drain_timeout: Option<u32>,
    #[serde(default)]
    force_drain: bool,
}

pub(super) async fn create_remove_node(
    State(app): State<Arc<App>>,
    Query(q): Query<RemoveQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    let hosts = names(&q.hosts);
    if hosts.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "hosts names no host to remove (hosts=NAME[,NAME]); nothing was stored".into(),
        ));
    }
    let max = kubexm_installer::ops::remove::MAX_DRAIN_TIMEOUT;
    if q.drain_timeout.is_some_and(|t| t == 0 || t > max) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("drainTimeout must be 1 to {max} seconds; nothing was stored"),
        ));
    }
    let request = OpRequest::RemoveNode(kubexm_installer::ops::request::RemoveRequest {
        hosts,
        unreachable: names(&q.unreachable),
        drain_timeout: q.drain_timeout,
        force_drain: q.force_drain,
    });
    hosts_job(app, body, request, who).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteQuery {
    #[serde(default)]
    confirm: bool,
    #[serde(default)]
    purge: bool,
    /// Comma-separated host names.
    #[serde(default)]
    unreachable: String,
}

pub(super) async fn create_delete(
    State(app): State<Arc<App>>,
    Query(q): Query<DeleteQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    confirm(
        q.confirm,
        "a delete resets every host of the cluster, etcd data included, and forgets it",
    )?;
    let request = OpRequest::DeleteCluster(kubexm_installer::ops::request::DeleteRequest {
        unreachable: names(&q.unreachable),
        purge: q.purge,
    });
    hosts_job(app, body, request, who).await
}

/// Refuses a destructive request not confirmed (`?confirm=true`), saying
/// what it would have done.
fn confirm(confirmed: bool, what: &str) -> Result<(), ApiError> {
    if confirmed {
        return Ok(());
    }
    Err(ApiError(
        StatusCode::BAD_REQUEST,
        format!("{what}; nothing was stored. Ask again with ?confirm=true"),
    ))
}

/// A comma-separated list of names, empty ones left out.
pub(super) fn names(list: &str) -> Vec<String> {
    list.split(',').filter(|h| !h.is_empty()).map(str::to_string).collect()
}

/// A facts, reset, etcd snapshot, remove-node or delete job for the hosts of the body's config.
async fn hosts_job(app: Arc<App>, body: Bytes, request: OpRequest, who: Principal) -> Result<Response, ApiError> {
    let _turn = app.validating.acquire().await.map_err(internal)?;
    let (cluster, text) = blocking(move || {
        let text = utf8(&body)?;
        Ok((ops::validate_text(&text, "cluster.yaml", None), text))
    })
    .await?;
    // The hosts the request names are the config's, or nothing is stored.
    if let Ok(c) = &cluster
        && let Err(e) = kubexm_installer::ops::session::check_hosts(c, &request.named_hosts())
    {
        return Err(ApiError(StatusCode::BAD_REQUEST, format!("{e:#}; nothing was stored")));
    }
    store_validated(&app, cluster, &text, &request, who).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CertsQuery {
    warn_days: Option<u32>,
}

pub(super) async fn create_certs_check(
    State(app): State<Arc<App>>,
    Query(q): Query<CertsQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    let request = OpRequest::CertsCheck(kubexm_installer::ops::request::CertsRequest {
        unreachable: vec![],
        warn_days: q.warn_days,
    });
    hosts_job(app, body, request, who).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RenewQuery {
    within_days: Option<u32>,
    #[serde(default)]
    all: bool,
    /// Comma-separated host names.
    #[serde(default)]
    unreachable: String,
}

pub(super) async fn create_certs_renew(
    State(app): State<Arc<App>>,
    Query(q): Query<RenewQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    let request = OpRequest::CertsRenew(kubexm_installer::ops::request::RenewCertsRequest {
        unreachable: names(&q.unreachable),
        within_days: q.within_days,
        all: q.all,
    });
    hosts_job(app, body, request, who).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RestoreQuery {
    #[serde(default)]
    confirm: bool,
    snapshot: String,
}

pub(super) async fn create_etcd_restore(
    State(app): State<Arc<App>>,
    Query(q): Query<RestoreQuery>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    body_type(&headers)?;
    confirm(
        q.confirm,
        "a restore stops every API server and etcd member and puts etcd back to the snapshot: what changed since is lost",
    )?;
    let restore = kubexm_installer::ops::request::RestoreRequest { snapshot: q.snapshot };
    if let Err(e) = restore.checked() {
        return Err(ApiError(StatusCode::BAD_REQUEST, format!("{e:#}; nothing was stored")));
    }
    hosts_job(app, body, OpRequest::EtcdRestore(restore), who).await
}
