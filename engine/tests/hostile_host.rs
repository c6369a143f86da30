//! A host that works against the worker: prints without end, accepts a
//! connection and then stalls, or waits for a big file to be read into
//! memory; and the state database as others on the machine see it.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use kubexm_engine::events::{Collect, Event};
use kubexm_engine::fake::{Fake, Log};
use kubexm_engine::files::Upload;
use kubexm_engine::output::{EVENT_LINES, KEEP};
use kubexm_engine::plan::{Check, Module, Pipeline, Scope, Step, StepError, Task};
use kubexm_engine::run::{EngineOptions, run};
use kubexm_engine::ssh::{self, Credential, MemoryKnownHosts, Target};
use kubexm_engine::state::{Outcome, STEP_LOG_KEEP, State};
use kubexm_engine::steps::Shell;
use kubexm_engine::transport::{CmdOutput, Transport, TransportError};

fn pipeline(step: Arc<dyn Step>) -> Pipeline {
    Pipeline {
        name: "p".into(),
        modules: vec![Module {
            name: "m".into(),
            tasks: vec![Task {
                name: "t".into(),
                hosts: vec!["h1".into()],
                steps: vec![step],
                after: Vec::<(String, Scope)>::new(),
            }],
        }],
    }
}

/// Runs `step` on one host answering with `out`; the stored step and the log lines sent.
async fn run_one(step: Arc<dyn Step>, out: CmdOutput) -> (kubexm_engine::state::StepRecord, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open(&dir.path().join("state.db"), vec![]).unwrap();
    let fake = Fake {
        host: "h1".into(),
        script: Arc::new(move |_, _| Ok(out.clone())),
        log: Log::default(),
        latency: Duration::ZERO,
    };
    let ts = [("h1".to_string(), Arc::new(fake) as Arc<dyn Transport>)].into_iter().collect();
    let sink = Arc::new(Collect::default());
    let plan = pipeline(step).plan().unwrap();
    let job = st.begin_job("c", "test").unwrap();
    let opts = EngineOptions {
        events: Some(sink.clone()),
        ..Default::default()
    };
    run(&plan, &ts, &st, "c", job, &opts, Arc::new(AtomicBool::new(false))).await;
    let lines = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match &e.event {
            Event::LogLine { line, .. } => Some(line.clone()),
            _ => None,
        })
        .collect();
    (st.steps(job).unwrap().remove(0), lines)
}

/// A host printing 40 MiB in 4 million lines: every transport bounded the
/// whole of it in memory, and it went whole into the state database and, line
/// by line, into the job's log.
#[tokio::test]
async fn a_command_printing_megabytes_is_kept_as_head_and_tail_with_the_drop_said() {
    let flood: String = (0..4_000_000).map(|i| format!("line {i:04}\n")).collect::<String>();
    let out = CmdOutput {
        code: Some(0),
        stdout: flood.clone(),
        stderr: String::new(),
    };
    let (step, lines) = run_one(Arc::new(Shell::new("s", None, "flood")), out).await;
    assert_eq!(step.status, "applied");
    assert!(step.log.len() <= KEEP + 100, "{} bytes stored", step.log.len());
    assert!(step.log.starts_with("line 0000\nline 0001\n"), "{}", &step.log[..40]);
    assert!(step.log.ends_with("line 3999999\n"), "{}", &step.log[step.log.len() - 40..]);
    let said = format!("[kubexm: {} bytes of output dropped]", flood.len() - KEEP);
    assert!(step.log.contains(&said), "no `{said}`");
    assert!(lines.len() <= EVENT_LINES + 1, "{} log lines sent", lines.len());
    assert!(lines.iter().any(|l| l.contains("lines of this log dropped")), "{lines:?}");
}

/// A step (not a transport) whose own log is huge: bounded before the state database.
struct Loud;

impl Step for Loud {
    fn name(&self) -> &str {
        "loud"
    }
    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }
    fn apply<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async { Ok("é".repeat(5 << 20)) })
    }
}

#[tokio::test]
async fn a_step_log_is_bounded_before_it_is_stored() {
    let (step, _) = run_one(Arc::new(Loud), CmdOutput::default()).await;
    assert_eq!(step.status, Outcome::Applied.as_str());
    assert!(step.log.len() <= STEP_LOG_KEEP + 100, "{} bytes stored", step.log.len());
    assert!(step.log.contains("bytes of output dropped]"));
    assert!(!step.log.contains('\u{FFFD}'), "a character was cut in two");
}

/// Step logs and pinned host keys are for the operator: the database, its
/// WAL sidecars and the directory made for it were created with the umask
/// (0644, 0755 on most machines).
#[test]
fn the_state_database_is_private_to_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("var/kubexm/state.db");
    let st = State::open(&path, vec![]).unwrap();
    st.begin_job("c", "test").unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600, "state.db");
    for sidecar in ["state.db-wal", "state.db-shm"] {
        let p = path.with_file_name(sidecar);
        assert!(p.exists(), "{sidecar} missing");
        assert_eq!(mode(&p), 0o600, "{sidecar}");
    }
    assert_eq!(mode(&dir.path().join("var")), 0o711);
    assert_eq!(mode(&dir.path().join("var/kubexm")), 0o711);
    drop(st);
    // A database an earlier kubexm left readable is made private when opened.
    let old = dir.path().join("old.db");
    std::fs::write(&old, b"").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    State::open(&old, vec![]).unwrap();
    assert_eq!(mode(&old), 0o600);
}

/// Records how files reach it; a whole-file `put` of a local file is the defect.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<String>>);

impl Transport for Recorder {
    fn host(&self) -> &str {
        "h1"
    }
    fn run<'a>(&'a self, _: &'a str, _: Duration) -> BoxFuture<'a, Result<CmdOutput, TransportError>> {
        Box::pin(async {
            Ok(CmdOutput {
                code: Some(100),
                ..Default::default()
            })
        })
    }
    fn put<'a>(&'a self, data: &'a [u8], path: &'a str, _: u32) -> BoxFuture<'a, Result<(), TransportError>> {
        self.0.lock().unwrap().push(format!("put {path} ({} bytes in memory)", data.len()));
        Box::pin(async { Ok(()) })
    }
    fn put_file<'a>(
        &'a self,
        local: &'a std::path::Path,
        sha256: &'a str,
        path: &'a str,
        _: u32,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.0
            .lock()
            .unwrap()
            .push(format!("stream {} -> {path} {sha256}", local.display()));
        Box::pin(async { Ok(()) })
    }
}

/// `Upload` and `Distribute` without curl read the whole local file (a
/// bundle: gigabytes) into memory before sending it.
#[tokio::test]
async fn uploads_of_local_files_are_streamed_not_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("bundle.tar.zst");
    std::fs::write(&local, vec![7u8; 1 << 20]).unwrap();
    let digest = kubexm_bundle::digest::sha256_hex(&vec![7u8; 1 << 20]);
    let up = Upload::new("up", &local, "/opt/b.tar.zst", 0o644).unwrap();
    let t = Recorder::default();
    up.apply(&t).await.unwrap();
    let dist = kubexm_engine::steps::Distribute::one(
        "d",
        kubexm_engine::steps::FileCopy {
            url: "https://files.example/b".into(),
            local: local.clone(),
            sha256: digest.clone(),
            dest: "/opt/c".into(),
            mode: 0o644,
        },
    );
    dist.apply(&t).await.unwrap();
    let calls = t.0.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            format!("stream {} -> /opt/b.tar.zst {digest}", local.display()),
            format!("stream {} -> /opt/c {digest}", local.display()),
        ]
    );
}

/// An SSH server that completes the handshake, then stalls where told.
#[derive(Clone, Copy)]
enum Stall {
    Auth,
    DirectTcpip,
}

struct Tarpit(Stall);

impl russh::server::Handler for Tarpit {
    type Error = russh::Error;

    async fn auth_password(&mut self, _: &str, _: &str) -> Result<russh::server::Auth, Self::Error> {
        if let Stall::Auth = self.0 {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(russh::server::Auth::Accept)
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        _: russh::Channel<russh::server::Msg>,
        _: &str,
        _: u32,
        _: &str,
        _: u32,
        _reply: russh::server::ChannelOpenHandle,
        _: &mut russh::server::Session,
    ) -> Result<(), Self::Error> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    }
}

/// Listens on 127.0.0.1; each connection gets a [`Tarpit`] (or, without
/// `stall`, nothing at all: accepted and never answered).
async fn tarpit(stall: Option<Stall>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let key = russh::keys::PrivateKey::from(russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[7; 32]));
    let config = Arc::new(russh::server::Config {
        keys: vec![key],
        ..Default::default()
    });
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            match stall {
                None => held.push(stream),
                Some(s) => {
                    let config = config.clone();
                    tokio::spawn(async move {
                        if let Ok(session) = russh::server::run_stream(config, stream, Tarpit(s)).await {
                            let _ = session.await;
                        }
                    });
                }
            }
        }
    });
    port
}

fn target(name: &str, port: u16) -> Target {
    Target {
        name: name.into(),
        address: "127.0.0.1".into(),
        port,
        user: "root".into(),
        credential: Credential::Password("pw-for-the-test".into()),
        bastion: None,
        host_key: None,
    }
}

/// Connects with a 1 s timeout; how it ended and how long it took.
async fn connect_within_1s(t: &Target) -> (Result<(), TransportError>, Duration) {
    let start = Instant::now();
    let known = Arc::new(MemoryKnownHosts::default());
    // The outer 20 s turns the defect (no end at all) into a failed test, not a hang.
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        ssh::connect(t, known, false, false, Duration::from_secs(1)),
    )
    .await
    .expect("the connect never ended: the timeout does not cover it");
    (r.map(|_| ()), start.elapsed())
}

/// Only the SSH handshake was under the connect timeout: a server that
/// stalls authentication held the connect (and the worker's slot) for good.
#[tokio::test]
async fn a_host_that_stalls_authentication_fails_within_the_connect_timeout() {
    let port = tarpit(Some(Stall::Auth)).await;
    let (r, took) = connect_within_1s(&target("tarpit", port)).await;
    let e = r.unwrap_err();
    assert!(matches!(e, TransportError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("no answer within 1 s"), "{e}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// The bastion's `direct-tcpip` channel open was not under the timeout either.
#[tokio::test]
async fn a_bastion_that_never_opens_the_tunnel_fails_within_the_connect_timeout() {
    let port = tarpit(Some(Stall::DirectTcpip)).await;
    let mut t = target("behind", 22);
    t.bastion = Some(Box::new(target("jump", port)));
    let (r, took) = connect_within_1s(&t).await;
    let e = r.unwrap_err();
    assert!(e.to_string().contains("through bastion jump"), "{e}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn a_listener_that_says_nothing_fails_within_the_connect_timeout() {
    let port = tarpit(None).await;
    let (r, took) = connect_within_1s(&target("silent", port)).await;
    assert!(r.unwrap_err().to_string().contains("no answer within 1 s"));
    assert!(took < Duration::from_secs(3), "{took:?}");
}
