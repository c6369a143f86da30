//! Issue 25, item 5: the bundle registry left on the node network cannot be
//! taken down by a few addresses that are not nodes. Against the real
//! `serve` on loopback (127.0.0.0/8 gives as many source addresses as a
//! test wants): a source past its limit and a non-node past the cap are
//! closed at once while a node still pulls; a request head dribbled slower
//! than the header timeout is closed; with client authentication on, a
//! client without a certificate from the CA is refused in the handshake.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kubexm_installer::serve::{ConnectionLimits, Parts, ServeOptions, Tls, run};

/// An unpacked bundle with nothing in it but its manifest.
fn bundle_dir(dir: &Path) -> std::path::PathBuf {
    let b = dir.join("bundle");
    std::fs::create_dir_all(&b).unwrap();
    let m = kubexm_bundle::testing::manifest(vec![]);
    std::fs::write(b.join(kubexm_bundle::manifest::MANIFEST_NAME), m.to_yaml().unwrap()).unwrap();
    b
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `serve` on 127.0.0.1 on its own runtime; returns once it listens.
fn start(dir: &Path, tls: Tls, limits: ConnectionLimits, client_ca: Option<std::path::PathBuf>) -> SocketAddr {
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let opts = ServeOptions {
        bundle_dir: bundle_dir(dir),
        older: vec![],
        listen,
        tls,
        parts: Parts {
            registry: true,
            files: true,
        },
        limits,
        client_ca,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(run(opts, move |_, _| {
            let _ = tx.send(());
        }));
        eprintln!("serve ended: {r:?}");
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("serve did not start");
    listen
}

/// A connection to `to` from the loopback address `from`.
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = rt.block_on(sock.connect(to)).unwrap();
    let std = stream.into_std().unwrap();
    std.set_nonblocking(false).unwrap();
    std
}

/// Whether the server closed `s` (end of stream or a reset) within `wait`,
/// rather than leaving it open.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 256];
    match s.read(&mut b) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// `GET /v2/` over plain HTTP from `from`: the status line.
fn get_v2(from: &str, to: SocketAddr) -> String {
    let mut s = connect_from(from, to);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /v2/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or_default().to_string()
}

// Before: `serve` held every connection any address opened, for as long as
// it liked; a handful of addresses took every descriptor and nodes could
// no longer pull.
#[test]
fn a_source_past_its_limit_and_others_past_the_cap_are_closed_while_a_node_pulls() {
    let dir = tempfile::tempdir().unwrap();
    let node: IpAddr = "127.0.0.3".parse().unwrap();
    let addr = start(
        dir.path(),
        Tls::Plain,
        ConnectionLimits {
            max: 16,
            per_source: 8,
            nodes: vec![node],
        },
        None,
    );
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(connect_from("127.0.0.1", addr));
    }
    // Each of the eight is open (not closed within a moment).
    std::thread::sleep(Duration::from_millis(200));
    for s in &mut held {
        assert!(!closed_within(s, Duration::from_millis(50)), "an admitted connection was closed");
    }
    let mut ninth = connect_from("127.0.0.1", addr);
    assert!(
        closed_within(&mut ninth, Duration::from_secs(2)),
        "a ninth connection from one address was kept"
    );
    // Another address fills the cap; a third address is then closed at once.
    for _ in 0..8 {
        held.push(connect_from("127.0.0.2", addr));
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut other = connect_from("127.0.0.4", addr);
    assert!(
        closed_within(&mut other, Duration::from_secs(2)),
        "a connection past the cap was kept"
    );
    // The node is outside the cap: it is served at once.
    let start = Instant::now();
    let status = get_v2("127.0.0.3", addr);
    let took = start.elapsed();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    eprintln!("a node's GET /v2/ with the cap full and one source at its limit: {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The held connections are idle: closed after the idle timeout (10 s).
    let mut first = held.remove(0);
    assert!(
        closed_within(&mut first, Duration::from_secs(13)),
        "an idle connection was not closed"
    );
}

// Before: hyper's header-read timeout never fired (the server had no
// timer): a client sending its request head a byte at a time, each
// within any idle timeout, held its connection for ever.
#[test]
fn a_request_head_dribbled_slower_than_the_header_timeout_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let addr = start(dir.path(), Tls::Plain, ConnectionLimits::default(), None);
    let mut s = connect_from("127.0.0.1", addr);
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let head = b"GET /v2/ HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let start = Instant::now();
    let mut closed_after = None;
    for b in head.iter().cycle().take(40) {
        if s.write_all(&[*b]).is_err() || closed_within(&mut s, Duration::from_millis(500)) {
            closed_after = Some(start.elapsed());
            break;
        }
    }
    let took = closed_after.expect("the dribbled head was still open after 20 s");
    eprintln!("a dribbled request head was closed after {took:?}");
    assert!(took >= Duration::from_secs(9) && took < Duration::from_secs(15), "{took:?}");
}

// Before: the registry had no authentication; anyone who reached it
// downloaded every image, a site's private extra images too.
#[test]
fn with_a_client_ca_a_client_without_its_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let ca = kubexm_installer::pki::ensure_ca(&pki, "test registry CA").unwrap();
    let addr = start(
        dir.path(),
        Tls::Issued {
            pki_dir: pki.clone(),
            names: vec!["127.0.0.1".into()],
        },
        ConnectionLimits::default(),
        Some(ca.cert.clone()),
    );
    kubexm_installer::pki::ensure_cert(
        &ca,
        &pki,
        "lab1-registry-client",
        "lab1",
        &[],
        kubexm_installer::pki::Usage::Client,
        Default::default(),
    )
    .unwrap();
    let other = kubexm_installer::pki::ensure_ca(&dir.path().join("other"), "another CA").unwrap();
    kubexm_installer::pki::ensure_cert(
        &other,
        &dir.path().join("other"),
        "x",
        "x",
        &[],
        kubexm_installer::pki::Usage::Client,
        Default::default(),
    )
    .unwrap();
    let curl = |extra: &[&str]| {
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "--cacert"])
            .arg(&ca.cert)
            .args(extra)
            .arg(format!("https://{addr}/v2/"))
            .output()
            .unwrap()
    };
    let p = |p: &Path| p.to_string_lossy().into_owned();
    let (crt, key) = (p(&pki.join("lab1-registry-client.crt")), p(&pki.join("lab1-registry-client.key")));
    let with = curl(&["--cert", &crt, "--key", &key]);
    assert_eq!(String::from_utf8_lossy(&with.stdout), "200", "with the node's certificate");
    let without = curl(&[]);
    assert!(!without.status.success(), "served without a client certificate");
    let (ocrt, okey) = (p(&dir.path().join("other/x.crt")), p(&dir.path().join("other/x.key")));
    let wrong = curl(&["--cert", &ocrt, "--key", &okey]);
    assert!(!wrong.status.success(), "served with another CA's certificate");
}

// Over h2 one connection carried 200 streams, each with a file open: past
// the cap, the per-source limit and LimitNOFILE. The server speaks HTTP/1.1
// only: an h2 client's preface gets no SETTINGS frame back.
#[test]
fn http2_is_not_spoken() {
    let dir = tempfile::tempdir().unwrap();
    let addr = start(dir.path(), Tls::Plain, ConnectionLimits::default(), None);
    let mut s = connect_from("127.0.0.9", addr);
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = Vec::new();
    let _ = s.read_to_end(&mut b);
    let settings = b.len() >= 9 && b[3] == 0x04;
    assert!(!settings, "the server answered in h2: {:?}", &b[..b.len().min(32)]);
    assert!(b.is_empty() || b.starts_with(b"HTTP/1.1"), "{:?}", String::from_utf8_lossy(&b));
}
