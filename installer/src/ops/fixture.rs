//! What the operations' unit tests share: a cluster `s` of four hosts (a
//! control-plane and etcd node, three workers) on fake hosts, installed as
//! far as its record knows.

use std::sync::Arc;

use kubexm_bom::record::ClusterRecord;

use crate::engine::fake::Connecting;
use crate::engine::run;
use crate::ops::session::{Config, Session, Settings};

pub const CONFIG: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: s\nspec:\n  hosts:\n\
                      \x20 - {name: a, address: 10.0.0.1, auth: {agent: true}}\n\
                      \x20 - {name: b, address: 10.0.0.2, auth: {agent: true}}\n\
                      \x20 - {name: c, address: 10.0.0.3, auth: {agent: true}}\n\
                      \x20 - {name: d, address: 10.0.0.4, auth: {agent: true}}\n\
                      \x20 roleGroups: {control-plane: [a], etcd: [a], worker: [b, c, d]}\n\
                      \x20 controlPlaneEndpoint: {mode: local-proxy}\n";

/// A state database and root in a temporary directory, and the fake hosts.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub connecting: Arc<Connecting>,
}

impl Fixture {
    /// A cluster `s` whose record says an install succeeded.
    pub fn installed() -> anyhow::Result<Fixture> {
        let f = Fixture {
            dir: tempfile::tempdir()?,
            connecting: Arc::new(Connecting::default()),
        };
        let s = f.session(CONFIG)?;
        let ex = s.execute("install", run::Policy::FailFast, |_| {
            Ok(crate::engine::jobs::one_task("probe", vec![], vec![]))
        })?;
        s.keep_record(ex.job, None, &Default::default())?;
        Ok(f)
    }

    /// A session of `text` (written as `s.yaml`) on the fake hosts.
    pub fn session(&self, text: &str) -> anyhow::Result<Session> {
        let path = self.dir.path().join("s.yaml");
        std::fs::write(&path, text)?;
        Ok(Session::open(&Config::File(path), None, None, self.settings())?.with_connector(self.connecting.clone()))
    }

    /// The settings of the fixture's sessions (its state database and root).
    pub fn settings(&self) -> Settings {
        let mut engine = Settings::engine_only(crate::ops::EngineSettings {
            state: self.dir.path().join("state.db"),
            accept_new_host_key: false,
            concurrency: 4,
            events: None,
            stop: None,
            trust: Default::default(),
            connect_timeout: crate::ops::CONNECT_TIMEOUT,
            connect_attempts: 1,
            owner: Default::default(),
        });
        engine.root = self.dir.path().join("root");
        engine
    }

    /// The cluster's latest record.
    pub fn record(&self) -> anyhow::Result<ClusterRecord> {
        crate::ops::status::record(&self.dir.path().join("state.db"), "s")
    }
}
