//! Helm charts from HTTP repositories, plain URLs and OCI registries.
//!
//! Every chart is verified: a repository's `index.yaml` lists each chart's
//! sha256, an OCI registry addresses content by digest, and a plain URL
//! needs the sha256 in the config.

use serde::{Deserialize, Serialize};

use kubexm_bom::{ChartItem, ChartSource};

use super::FetchError;
use super::http::Http;
use crate::cache::Cache;

const HELM_CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    entries: std::collections::BTreeMap<String, Vec<Entry>>,
}

#[derive(Deserialize)]
struct Entry {
    version: String,
    #[serde(default)]
    urls: Vec<String>,
    #[serde(default)]
    digest: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Resolved {
    url: String,
    sha256: String,
}

/// Fetches a chart into the cache; returns its sha256.
pub async fn fetch(http: &Http, puller: &super::images::Puller, cache: &Cache, chart: &ChartItem) -> Result<String, FetchError> {
    let artifact = format!("chart {} {}", chart.name, chart.version);
    let err = |why: String| FetchError::Chart {
        artifact: artifact.clone(),
        why,
    };
    match &chart.source {
        ChartSource::Url { url } => {
            let sha = chart
                .sha256
                .clone()
                .ok_or_else(|| err(format!("{url} has no sha256 in the config; add sha256 to the chart entry")))?;
            http.fetch(cache, &artifact, url, &sha).await?;
            Ok(sha)
        }
        ChartSource::Repo { repo } => {
            let key = format!("{repo}|{}|{}", chart.name, chart.version);
            if let Some(r) = cache.get_ref::<Resolved>("charts", &key)
                && cache.has(&r.sha256)
            {
                return Ok(r.sha256);
            }
            let index_url = format!("{}/index.yaml", repo.trim_end_matches('/'));
            let text = http.get_bytes(&artifact, &index_url).await?;
            let text = String::from_utf8(text).map_err(|_| err(format!("{index_url} is not UTF-8 text")))?;
            let index: Index = serde_saphyr::from_str(&text).map_err(|e| {
                err(format!(
                    "{index_url} is not a chart index: {}",
                    e.to_string().lines().next().unwrap_or_default()
                ))
            })?;
            let entries = index
                .entries
                .get(&chart.name)
                .ok_or_else(|| err(format!("{index_url} has no chart named {}", chart.name)))?;
            let entry = entries.iter().find(|e| e.version == chart.version).ok_or_else(|| {
                let have: Vec<&str> = entries.iter().take(8).map(|e| e.version.as_str()).collect();
                err(format!(
                    "{index_url} has no version {} of {} (it has {})",
                    chart.version,
                    chart.name,
                    have.join(", ")
                ))
            })?;
            let sha = entry
                .digest
                .clone()
                .filter(|d| kubexm_bundle::digest::is_sha256_hex(d))
                .ok_or_else(|| err(format!("{index_url} lists no sha256 digest for it; refusing an unverified chart")))?;
            let url = entry.urls.first().ok_or_else(|| err(format!("{index_url} lists no URL for it")))?;
            let url = if url.contains("://") {
                url.clone()
            } else {
                format!("{}/{}", repo.trim_end_matches('/'), url.trim_start_matches('/'))
            };
            http.fetch(cache, &artifact, &url, &sha).await?;
            cache
                .set_ref("charts", &key, &Resolved { url, sha256: sha.clone() })
                .map_err(FetchError::io("cache"))?;
            Ok(sha)
        }
        ChartSource::Oci { reference } => {
            let location = format!("{}:{}", reference.trim_start_matches("oci://"), chart.version);
            let key = format!("oci|{location}");
            if let Some(r) = cache.get_ref::<Resolved>("charts", &key)
                && cache.has(&r.sha256)
            {
                return Ok(r.sha256);
            }
            let sha = puller.chart_layer(cache, &location, HELM_CHART_LAYER).await.map_err(err)?;
            cache
                .set_ref(
                    "charts",
                    &key,
                    &Resolved {
                        url: location,
                        sha256: sha.clone(),
                    },
                )
                .map_err(FetchError::io("cache"))?;
            Ok(sha)
        }
    }
}
