//! The API server the API tests start on loopback, with its real TLS, a
//! token and a held bundle (shared by api.rs and api_principals.rs).
#![allow(dead_code)] // each test file uses part of it

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use kubexm_server::api::{self, ApiOptions};
use kubexm_server::jobdb::JobDb;

use crate::common::held_bundle;

pub struct Server {
    pub dir: tempfile::TempDir,
    pub db: Arc<JobDb>,
    pub addr: SocketAddr,
    pub handle: axum_server::Handle<SocketAddr>,
    pub token: String,
    pub digest: String,
}

impl Server {
    pub fn options(dir: &Path) -> ApiOptions {
        ApiOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls_dir: dir.join("tls"),
            names: vec!["127.0.0.1".into(), "localhost".into()],
            bundles: dir.join("bundles"),
            max_connections: kubexm_server::api::limits::MAX_CONNECTIONS,
            health_listen: None,
            worker: None,
            post_rate: kubexm_server::api::POST_RATE,
            root: None,
        }
    }

    pub async fn start() -> Server {
        Self::start_with(kubexm_server::api::POST_RATE).await
    }

    /// A server whose principals may change `post_rate` things a minute
    /// after the burst.
    pub async fn start_with(post_rate: u32) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let (digest, _) = held_bundle(dir.path());
        let db = Arc::new(JobDb::open(&dir.path().join("jobs.db")).await.unwrap());
        use kubexm_server::jobdb::Scope;
        let token = db
            .create_token_scoped("test", &[Scope::Read, Scope::Create, Scope::Reset], None)
            .await
            .unwrap();
        let (handle, addr) = Self::serve_with(&db, dir.path(), post_rate).await;
        Server {
            dir,
            db,
            addr,
            handle,
            token,
            digest,
        }
    }

    pub async fn serve(db: &Arc<JobDb>, dir: &Path) -> (axum_server::Handle<SocketAddr>, SocketAddr) {
        Self::serve_with(db, dir, kubexm_server::api::POST_RATE).await
    }

    pub async fn serve_with(db: &Arc<JobDb>, dir: &Path, post_rate: u32) -> (axum_server::Handle<SocketAddr>, SocketAddr) {
        let handle = axum_server::Handle::new();
        let o = ApiOptions {
            post_rate,
            ..Self::options(dir)
        };
        tokio::spawn(api::serve(db.clone(), o, handle.clone()));
        let addr = handle.listening().await.expect("the API server did not start");
        (handle, addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.addr.port())
    }

    pub fn ca(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(&std::fs::read(self.dir.path().join("tls/ca.crt")).unwrap()).unwrap()
    }

    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::builder().tls_certs_only([self.ca()]).build().unwrap()
    }

    pub async fn get_json(&self, url: String) -> serde_json::Value {
        let r = self.client().get(url).bearer_auth(&self.token).send().await.unwrap();
        r.json().await.unwrap()
    }

    /// Stores the example config as a job through the API; its id.
    pub async fn create_job(&self) -> i64 {
        let r = self.post(&crate::common::EXAMPLE).await;
        r.json::<serde_json::Value>().await.unwrap()["job_id"].as_i64().unwrap()
    }

    pub async fn post(&self, yaml: &str) -> reqwest::Response {
        self.client()
            .post(self.url(&format!("/api/v1/clusters?bundle={}", self.digest)))
            .bearer_auth(&self.token)
            .header("content-type", "application/yaml")
            .body(yaml.to_string())
            .send()
            .await
            .unwrap()
    }
}
