//! A recording transport for unit tests of plans and the engine: it answers
//! from a script, records every call, and can wait to simulate latency.
//! Never used against a host.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::inventory::{Connected, Connector};
use crate::ssh::{KnownHosts, Target};
use crate::transport::{CmdOutput, Transport, TransportError};

/// Decides the answer to one command on one host.
pub type Script = Arc<dyn Fn(&str, &str) -> Result<CmdOutput, TransportError> + Send + Sync>;

/// What every fake host did, in order: (host, command or `put PATH`); the
/// flag, when set, keeps nothing.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<(String, String)>>>, pub bool);

impl Log {
    pub fn calls(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A log that keeps nothing (benchmarks of the engine, not of the fake).
    pub fn off() -> Log {
        Log(Arc::default(), true)
    }

    fn push(&self, host: &str, what: String) {
        if !self.1 {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push((host.to_string(), what));
        }
    }
}

pub struct Fake {
    pub host: String,
    pub script: Script,
    pub log: Log,
    pub latency: Duration,
}

impl Fake {
    /// A host where every command succeeds with no output.
    pub fn ok(host: &str, log: Log) -> Fake {
        Fake {
            host: host.into(),
            script: Arc::new(|_, _| {
                Ok(CmdOutput {
                    code: Some(0),
                    ..Default::default()
                })
            }),
            log,
            latency: Duration::ZERO,
        }
    }
}

impl Transport for Fake {
    fn host(&self) -> &str {
        &self.host
    }

    fn run<'a>(&'a self, command: &'a str, _timeout: Duration) -> BoxFuture<'a, Result<CmdOutput, TransportError>> {
        Box::pin(async move {
            self.log.push(&self.host, command.to_string());
            if !self.latency.is_zero() {
                tokio::time::sleep(self.latency).await;
            }
            // Bounded as the SSH transport bounds what a host prints.
            (self.script)(&self.host, command).map(|mut out| {
                out.stdout = crate::output::bound(&out.stdout, crate::output::KEEP).into_owned();
                out.stderr = crate::output::bound(&out.stderr, crate::output::KEEP).into_owned();
                out
            })
        })
    }

    fn put<'a>(&'a self, _data: &'a [u8], path: &'a str, _mode: u32) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.log.push(&self.host, format!("put {path}"));
            Ok(())
        })
    }

    /// The file's content is what the script prints for `get PATH`.
    fn get_file<'a>(&'a self, path: &'a str, local: &'a std::path::Path) -> BoxFuture<'a, Result<String, TransportError>> {
        Box::pin(async move {
            self.log.push(&self.host, format!("get {path}"));
            let out = (self.script)(&self.host, &format!("get {path}"))?;
            let fail = |why: String| TransportError::Download {
                host: self.host.clone(),
                path: path.to_string(),
                why,
            };
            if !out.success() {
                return Err(fail(out.stderr));
            }
            std::fs::write(local, out.stdout.as_bytes()).map_err(|e| fail(e.to_string()))?;
            Ok(kubexm_bundle::digest::sha256_hex(out.stdout.as_bytes()))
        })
    }

    fn put_file<'a>(
        &'a self,
        _local: &'a std::path::Path,
        _sha256: &'a str,
        path: &'a str,
        _mode: u32,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.log.push(&self.host, format!("put {path}"));
            Ok(())
        })
    }
}

/// Hands out a fake host for every target (answering by `script`, else
/// [`Fake::ok`]'s way) and records every host it was asked to connect to.
#[derive(Default)]
pub struct Connecting {
    pub asked: Mutex<Vec<String>>,
    pub log: Log,
    pub script: Option<Script>,
}

impl Connecting {
    /// The hosts asked for, in order.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Connector for Connecting {
    fn connect<'a>(&'a self, targets: &'a [Target], _: Arc<dyn KnownHosts>) -> BoxFuture<'a, Connected> {
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = std::collections::HashMap::new();
        for t in targets {
            asked.push(t.name.clone());
            let mut fake = Fake::ok(&t.name, self.log.clone());
            if let Some(s) = &self.script {
                fake.script = s.clone();
            }
            out.insert(t.name.clone(), Arc::new(fake) as Arc<dyn Transport>);
        }
        Box::pin(async move { (out, Vec::new()) })
    }
}
