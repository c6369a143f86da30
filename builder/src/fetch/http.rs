//! Files over HTTP(S): parallel, retried, resumed, verified while streaming.
//!
//! A download goes to `tmp/<key>.part` in the cache. When a previous attempt
//! left a partial file, its bytes are re-hashed and the rest is requested
//! with `Range`; an answer of 200 instead of 206 restarts from zero. The
//! sha256 is computed as bytes arrive and compared before the file is
//! renamed into the cache, so nothing unverified is ever kept.

use std::io::{Read, Write};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::{FetchError, error_chain};
use crate::cache::Cache;

/// Attempts per download, counting resumptions.
const ATTEMPTS: u32 = 6;

#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    /// Called with the byte count of every chunk received (progress).
    on_bytes: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
    requests: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Http {
    pub fn new(on_bytes: std::sync::Arc<dyn Fn(u64) + Send + Sync>) -> Result<Http, reqwest::Error> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("kubexm-bundle/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .build()?;
        Ok(Http {
            client,
            on_bytes,
            requests: Default::default(),
        })
    }

    /// Upstream requests made so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Small text (checksum files, chart indexes, manifests), with retries.
    pub async fn get_bytes(&self, artifact: &str, url: &str) -> Result<Vec<u8>, FetchError> {
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match self.client.get(url).send().await {
                Ok(r) if r.status().is_success() => match r.bytes().await {
                    Ok(b) => return Ok(b.to_vec()),
                    Err(e) => last = e.to_string(),
                },
                Ok(r) if r.status().is_server_error() => last = format!("HTTP {}", r.status()),
                Ok(r) => return Err(status_error(artifact, url, r.status().as_u16())),
                Err(e) => last = error_chain(&e),
            }
            backoff(attempt).await;
        }
        Err(gave_up(artifact, url, last))
    }

    /// Downloads `url` into the cache, requiring sha256 `expected`.
    pub async fn fetch(&self, cache: &Cache, artifact: &str, url: &str, expected: &str) -> Result<(), FetchError> {
        if cache.has(expected) {
            return Ok(());
        }
        let part = cache.partial(url);
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            match self.attempt(&part, url).await {
                Ok(actual) if actual == expected => {
                    cache.commit(&part, expected).map_err(FetchError::io(part.display()))?;
                    return Ok(());
                }
                Ok(actual) => {
                    let _ = fs_err::remove_file(&part);
                    return Err(FetchError::BadDigest {
                        artifact: artifact.into(),
                        url: url.into(),
                        expected: expected.into(),
                        actual,
                    });
                }
                Err(Attempt::Fatal(status)) => return Err(status_error(artifact, url, status)),
                Err(Attempt::Io(e)) => {
                    return Err(FetchError::Io {
                        path: part.display().to_string(),
                        source: e,
                    });
                }
                Err(Attempt::Retry(why)) => {
                    tracing::info!(artifact, url, attempt, "download interrupted ({why}); resuming");
                    last = why;
                }
            }
            backoff(attempt).await;
        }
        Err(gave_up(artifact, url, last))
    }

    /// One request, continuing `part` if it has bytes. Returns the sha256 of the whole file.
    async fn attempt(&self, part: &std::path::Path, url: &str) -> Result<String, Attempt> {
        let mut hasher = Sha256::new();
        let mut offset = 0u64;
        if let Ok(mut f) = fs_err::File::open(part) {
            // Re-hash what an earlier attempt wrote; it continues from here.
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf).map_err(Attempt::Io)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                offset += n as u64;
            }
        }
        let mut req = self.client.get(url);
        if offset > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={offset}-"));
        }
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let resp = req.send().await.map_err(|e| Attempt::Retry(error_chain(&e)))?;
        let status = resp.status();
        let mut file = match (status.as_u16(), offset) {
            (206, o) if o > 0 => fs_err::OpenOptions::new().append(true).open(part).map_err(Attempt::Io)?,
            (200, _) => {
                // A full answer: start over, whatever was there.
                hasher = Sha256::new();
                fs_err::File::create(part).map_err(Attempt::Io)?
            }
            (416, _) => {
                let _ = fs_err::remove_file(part);
                return Err(Attempt::Retry("the server refused the resume range; restarting".into()));
            }
            (s, _) if (500..600).contains(&s) || s == 429 => return Err(Attempt::Retry(format!("HTTP {s}"))),
            (s, _) => return Err(Attempt::Fatal(s)),
        };
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Attempt::Retry(error_chain(&e)))?;
            file.write_all(&chunk).map_err(Attempt::Io)?;
            hasher.update(&chunk);
            (self.on_bytes)(chunk.len() as u64);
        }
        file.flush().map_err(Attempt::Io)?;
        Ok(hex::encode(hasher.finalize()))
    }
}

enum Attempt {
    Retry(String),
    Fatal(u16),
    Io(std::io::Error),
}

fn gave_up(artifact: &str, url: &str, why: String) -> FetchError {
    FetchError::Network {
        artifact: artifact.into(),
        url: url.into(),
        attempts: ATTEMPTS,
        why,
    }
}

fn status_error(artifact: &str, url: &str, status: u16) -> FetchError {
    let hint = match status {
        404 => "; the version may not exist upstream, or the mirror lacks it".to_string(),
        401 | 403 => "; check credentials or the mirror's access rules".to_string(),
        _ => String::new(),
    };
    FetchError::Status {
        artifact: artifact.into(),
        url: url.into(),
        status,
        hint,
    }
}

async fn backoff(attempt: u32) {
    let ms = (250u64 << attempt.min(5)).min(8_000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
