//! The `kubexm` command's side of the API: a client config file naming the
//! server, its CA and the credentials (never the command line), and the
//! calls `create`, `get` and `cancel` make when a server is configured. A
//! followed log that breaks off is resumed from the last sequence number
//! received, so each line is printed once.

use kubexm_installer::ops::request::Request;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use kubexm_bom::diag::error_chain;
use serde::Deserialize;

use crate::jobdb::{Job, LogLine};

/// The client config file, unless `--config` or `KUBEXM_CONFIG` names one.
pub const CLIENT_CONFIG: &str = "/etc/kubexm/client.yaml";

/// Where the API server is and how to prove who we are.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfig {
    /// `https://host:port`.
    pub server: String,
    /// The server's CA certificate (PEM file).
    pub ca: PathBuf,
    /// A file holding a bearer token (`kubexm token create`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A client certificate and key from the server's CA (`kubexm client-cert create`).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{path}: {why}")]
    Config { path: String, why: String },
    #[error("{url}: {why}")]
    Http { url: String, why: String },
    /// The server refused the config (422): every error, as `kubexm-bundle validate` prints them.
    #[error("{0}")]
    Invalid(String),
    /// The server answered an error.
    #[error("{url}: {status}: {message}")]
    Refused { url: String, status: u16, message: String },
}

impl ClientConfig {
    /// The config at `path` (relative paths in it are relative to its directory).
    pub fn load(path: &Path) -> Result<ClientConfig, ClientError> {
        let bad = |why: String| ClientError::Config {
            path: path.display().to_string(),
            why,
        };
        let text = fs_err::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut c: ClientConfig = serde_saphyr::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [
            Some(&mut c.ca),
            c.token_file.as_mut(),
            c.client_cert.as_mut(),
            c.client_key.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        if c.token_file.is_none() && c.client_cert.is_none() {
            return Err(bad("name a tokenFile or a clientCert and clientKey".into()));
        }
        if !c.server.starts_with("https://") {
            return Err(bad(format!(
                "server: {:?} is not https://: a token or key is never sent in the clear",
                crate::text::line(&c.server)
            )));
        }
        if c.client_cert.is_some() != c.client_key.is_some() {
            return Err(bad("clientCert and clientKey go together".into()));
        }
        Ok(c)
    }
}

/// A connection to the API server.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ClientError> {
    fs_err::read(path).map_err(|e| ClientError::Config {
        path: path.display().to_string(),
        why: format!("{what}: {e}"),
    })
}

impl Client {
    pub fn new(c: &ClientConfig) -> Result<Client, ClientError> {
        let cfg = |path: &Path, why: String| ClientError::Config {
            path: path.display().to_string(),
            why,
        };
        let ca = reqwest::Certificate::from_pem(&read(&c.ca, "the server's CA")?).map_err(|e| cfg(&c.ca, e.to_string()))?;
        let mut b = reqwest::Client::builder()
            .tls_certs_only([ca])
            .connect_timeout(Duration::from_secs(10));
        if let (Some(cert), Some(key)) = (&c.client_cert, &c.client_key) {
            let mut pem = read(cert, "the client certificate")?;
            pem.extend(read(key, "the client key")?);
            b = b.identity(reqwest::Identity::from_pem(&pem).map_err(|e| cfg(cert, e.to_string()))?);
        }
        let token = match &c.token_file {
            Some(f) => Some(String::from_utf8_lossy(&read(f, "the token")?).trim().to_string()),
            None => None,
        };
        Ok(Client {
            http: b.build().map_err(|e| cfg(&c.ca, e.to_string()))?,
            base: c.server.trim_end_matches('/').to_string(),
            token,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> (String, reqwest::RequestBuilder) {
        let url = format!("{}{path}", self.base);
        let mut r = self.http.request(method, &url);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        (url, r)
    }

    async fn send(&self, url: &str, r: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let resp = r.send().await.map_err(|e| ClientError::Http {
            url: url.to_string(),
            why: error_chain(&e),
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        let message = body["error"].as_str().unwrap_or("(no message)").to_string();
        if status == 422 {
            return Err(ClientError::Invalid(message));
        }
        Err(ClientError::Refused {
            url: url.to_string(),
            status,
            message,
        })
    }

    async fn json<T: serde::de::DeserializeOwned>(&self, url: &str, r: reqwest::RequestBuilder) -> Result<T, ClientError> {
        self.send(url, r).await?.json().await.map_err(|e| ClientError::Http {
            url: url.to_string(),
            why: error_chain(&e),
        })
    }

    /// Stores a create-cluster job: `text` is cluster.yaml, `bundle` a digest.
    pub async fn create_cluster(&self, text: String, bundle: Option<&str>) -> Result<i64, ClientError> {
        let q = bundle.map(|b| format!("?bundle={b}")).unwrap_or_default();
        self.post_config(&format!("/api/v1/clusters{q}"), text).await
    }

    /// Stores an apply job (`kubexm scale`): `text` is cluster.yaml, `bundle` a digest.
    pub async fn create_apply(&self, text: String, bundle: Option<&str>) -> Result<i64, ClientError> {
        let q = bundle.map(|b| format!("?bundle={b}")).unwrap_or_default();
        self.post_config(&format!("/api/v1/clusters/apply{q}"), text).await
    }

    /// Stores an upgrade job (`kubexm upgrade cluster`): `text` is the
    /// cluster.yaml naming the new version, `bundle` its bundle's digest.
    pub async fn create_upgrade(&self, text: String, bundle: Option<&str>, r: &UpgradeOptions<'_>) -> Result<i64, ClientError> {
        let mut q: Vec<String> = bundle.map(|b| format!("bundle={b}")).into_iter().collect();
        if !r.skip_not_ready.is_empty() {
            q.push(format!("skipNotReady={}", list(r.skip_not_ready)));
        }
        q.extend(r.drain_timeout.map(|t| format!("drainTimeout={t}")));
        let q = if q.is_empty() { String::new() } else { format!("?{}", q.join("&")) };
        self.post_config(&format!("/api/v1/clusters/upgrade{q}"), text).await
    }

    /// Stores the job `request` asks for the cluster of `text` (cluster.yaml)
    /// through its route, its options as the route's query (a destructive
    /// one confirmed: the caller asked the operator). An install goes by
    /// [`Client::create_cluster`] (every phase).
    pub async fn create_hosts_job(&self, text: String, request: &Request) -> Result<i64, ClientError> {
        let mut q: Vec<String> = Vec::new();
        let route = match request {
            Request::Install(r) => return self.create_cluster(text, Some(&r.bundle)).await,
            Request::Apply(r) => return self.create_apply(text, Some(&r.bundle)).await,
            Request::Upgrade(r) => {
                let o = UpgradeOptions {
                    skip_not_ready: &r.skip_not_ready,
                    drain_timeout: r.drain_timeout,
                };
                return self.create_upgrade(text, Some(&r.bundle), &o).await;
            }
            Request::Facts(_) => "facts",
            Request::Reset(_) => {
                q.push("confirm=true".into());
                "reset"
            }
            Request::EtcdSnapshot(r) => {
                q.extend(r.keep.map(|k| format!("keep={k}")));
                "etcd-snapshot"
            }
            Request::CertsCheck(r) => {
                q.extend(r.warn_days.map(|d| format!("warnDays={d}")));
                "certs-check"
            }
            Request::CertsRenew(r) => {
                q.extend(r.within_days.map(|d| format!("withinDays={d}")));
                q.extend(r.all.then(|| "all=true".to_string()));
                "certs-renew"
            }
            Request::EtcdRestore(r) => {
                q.push("confirm=true".into());
                q.push(format!("snapshot={}", r.snapshot));
                "etcd-restore"
            }
            Request::RemoveNode(r) => {
                q.push(format!("hosts={}", list(&r.hosts)));
                q.extend(r.drain_timeout.map(|t| format!("drainTimeout={t}")));
                q.extend(r.force_drain.then(|| "forceDrain=true".to_string()));
                "remove-node"
            }
            Request::DeleteCluster(r) => {
                q.push("confirm=true".into());
                q.extend(r.purge.then(|| "purge=true".to_string()));
                "delete"
            }
        };
        // Only the routes that take hosts named unreachable get them.
        if matches!(request, Request::RemoveNode(_) | Request::DeleteCluster(_) | Request::CertsRenew(_))
            && !request.unreachable().is_empty()
        {
            q.push(format!("unreachable={}", list(request.unreachable())));
        }
        let q = if q.is_empty() { String::new() } else { format!("?{}", q.join("&")) };
        self.post_config(&format!("/api/v1/clusters/{route}{q}"), text).await
    }

    /// POSTs cluster.yaml; the id of the job stored.
    async fn post_config(&self, path: &str, text: String) -> Result<i64, ClientError> {
        let (url, r) = self.request(reqwest::Method::POST, path);
        let v: serde_json::Value = self.json(&url, r.header("content-type", "application/yaml").body(text)).await?;
        v["job_id"].as_i64().ok_or_else(|| ClientError::Http {
            url,
            why: format!("the answer has no job_id: {v}"),
        })
    }

    pub async fn job(&self, id: i64) -> Result<Job, ClientError> {
        let (url, r) = self.request(reqwest::Method::GET, &format!("/api/v1/jobs/{id}"));
        self.json(&url, r).await
    }

    /// Where job `id`'s time went, as its run stored it.
    pub async fn timeline(&self, id: i64) -> Result<kubexm_engine::timeline::Timeline, ClientError> {
        let (url, r) = self.request(reqwest::Method::GET, &format!("/api/v1/jobs/{id}/timeline"));
        self.json(&url, r).await
    }

    pub async fn jobs(&self) -> Result<Vec<Job>, ClientError> {
        #[derive(Deserialize)]
        struct List {
            jobs: Vec<Job>,
        }
        let (url, r) = self.request(reqwest::Method::GET, "/api/v1/jobs");
        Ok(self.json::<List>(&url, r).await?.jobs)
    }

    /// Returns the job's status after the request.
    pub async fn cancel(&self, id: i64) -> Result<crate::jobdb::Status, ClientError> {
        #[derive(Deserialize)]
        struct Answer {
            status: crate::jobdb::Status,
        }
        let (url, r) = self.request(reqwest::Method::POST, &format!("/api/v1/jobs/{id}/cancel"));
        Ok(self.json::<Answer>(&url, r).await?.status)
    }

    /// Hands `line` every log line of job `id` after `from`, each once and in
    /// order, until the job ends (`follow`) or the lines so far are read. A
    /// stream that breaks off is resumed from the last line received.
    pub async fn follow(&self, id: i64, from: i64, follow: bool, mut line: impl FnMut(&LogLine)) -> Result<(), ClientError> {
        let mut after = from;
        let mut failures = 0;
        loop {
            let (url, r) = self.request(
                reqwest::Method::GET,
                &format!("/api/v1/jobs/{id}/logs?follow={follow}&from={after}"),
            );
            let broke = match self.send(&url, r).await {
                Ok(resp) => match read_events(resp, &mut after, &mut line).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => format!("the stream ended before the job's end event (after line {after})"),
                    Err(e) => e,
                },
                Err(e @ ClientError::Http { .. }) => e.to_string(),
                Err(e) => return Err(e),
            };
            failures += 1;
            if failures > 30 {
                return Err(ClientError::Http { url, why: broke });
            }
            tracing::warn!("{url}: {broke}; resuming after line {after}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Reads server-sent events; true once the `end` event came.
async fn read_events(resp: reqwest::Response, after: &mut i64, line: &mut impl FnMut(&LogLine)) -> Result<bool, String> {
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.map_err(|e| error_chain(&e))?);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let (mut id, mut kind, mut data) = (None, "message", Vec::new());
            for l in text.lines() {
                if let Some(v) = l.strip_prefix("id:") {
                    id = v.trim_start().parse::<i64>().ok();
                } else if let Some(v) = l.strip_prefix("event:") {
                    kind = if v.trim() == "end" { "end" } else { "other" };
                } else if let Some(v) = l.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                }
            }
            match (kind, id) {
                ("end", _) => return Ok(true),
                ("message", Some(seq)) if seq > *after => {
                    line(&LogLine {
                        seq,
                        at: 0,
                        line: data.join("\n"),
                    });
                    *after = seq;
                }
                _ => {}
            }
        }
    }
    Ok(false)
}

/// `names` comma-separated for a query: host names are DNS labels once
/// validated; anything else is percent-escaped.
fn list(names: &[String]) -> String {
    kubexm_bom::text::percent(&names.join(","), b"-._,")
}

/// An upgrade job's options, as `create_upgrade` sends them.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpgradeOptions<'a> {
    /// NotReady workers to leave at their version.
    pub skip_not_ready: &'a [String],
    /// Each drain's time limit in seconds.
    pub drain_timeout: Option<u32>,
}
