//! What keeps clients from taking a server down (the API server's and the
//! bundle registry's): a cap on open connections, a limit per source
//! address, and an idle timeout. One connection more than a limit allows is
//! closed at once, with a log line at most every 10 s; a connection that
//! sends and receives nothing for its idle time is closed, before or after
//! its TLS handshake. Hyper's own header-read timeout (it needs the timer
//! [`http1_timeouts`] gives it) bounds a slow request head.
//!
//! The per-source limit is what keeps a few hostile addresses from taking
//! every slot: 2,000 idle connections from two addresses hold two
//! handfuls. Reserved sources (a registry's nodes) have only the per-source
//! limit and are not counted against the cap, so the cap, filled by anyone
//! else, never leaves a node without room to pull.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection idle this long (nothing read, nothing written) is closed.
pub const IDLE: Duration = Duration::from_secs(10);

/// Connections open at once unless told otherwise; the unit's
/// `LimitNOFILE` leaves room above it for the database and the worker.
pub const MAX_CONNECTIONS: usize = 4096;

/// The open connections and their limits.
#[derive(Debug)]
pub struct Limits {
    max: usize,
    idle: Duration,
    /// Connections one source address may hold (0: no limit).
    per_source: usize,
    /// Sources outside the cap (only their per-source limit applies).
    reserved: HashSet<IpAddr>,
    open: AtomicUsize,
    sources: Mutex<HashMap<IpAddr, usize>>,
    warned: Mutex<(Option<Instant>, Option<Instant>)>,
}

impl Limits {
    /// A cap of `max` connections, closed after `idle`; no per-source limit.
    pub fn new(max: usize, idle: Duration) -> Arc<Limits> {
        Limits::with_sources(max, idle, 0, [])
    }

    /// Also at most `per_source` connections from one address (0: no
    /// limit); connections from `reserved` do not count against `max`.
    pub fn with_sources(max: usize, idle: Duration, per_source: usize, reserved: impl IntoIterator<Item = IpAddr>) -> Arc<Limits> {
        Arc::new(Limits {
            max,
            idle,
            per_source,
            reserved: reserved.into_iter().map(|a| a.to_canonical()).collect(),
            open: AtomicUsize::new(0),
            sources: Mutex::new(HashMap::new()),
            warned: Mutex::new((None, None)),
        })
    }

    /// Connections open now under the cap (reserved sources' not counted).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections open now from `source`.
    pub fn open_from(&self, source: IpAddr) -> usize {
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources.get(&source.to_canonical()).copied().unwrap_or(0)
    }

    /// Logs a refusal at most every 10 s per kind (cap, per source).
    fn refuse(&self, per_source: Option<IpAddr>) -> std::io::Error {
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        let last = if per_source.is_some() { &mut warned.1 } else { &mut warned.0 };
        if last.is_none_or(|w| w.elapsed() > Duration::from_secs(10)) {
            *last = Some(Instant::now());
            match per_source {
                Some(a) => tracing::warn!(
                    "{a} holds {} connections, the most one address may (--max-per-source): its new ones are closed at once until some end (idle ones end after {} s)",
                    self.per_source,
                    self.idle.as_secs()
                ),
                None => tracing::warn!(
                    "{} connections are open, the most this server takes (--max-connections): new ones are closed at once until some end (idle ones end after {} s)",
                    self.max,
                    self.idle.as_secs()
                ),
            }
        }
        std::io::Error::other(if per_source.is_some() {
            "per-source connection limit reached"
        } else {
            "connection cap reached"
        })
    }

    /// `io` counted and watched for idleness, or refused at the cap.
    pub fn admit<I>(self: &Arc<Self>, io: I) -> std::io::Result<Guarded<I>> {
        self.admit_counted(None, io)
    }

    /// `io` from `source`, counted under the per-source limit and (unless
    /// the source is reserved) the cap, or refused.
    pub fn admit_from<I>(self: &Arc<Self>, source: IpAddr, io: I) -> std::io::Result<Guarded<I>> {
        self.admit_counted(Some(source.to_canonical()), io)
    }

    fn admit_counted<I>(self: &Arc<Self>, source: Option<IpAddr>, io: I) -> std::io::Result<Guarded<I>> {
        let reserved = source.is_some_and(|s| self.reserved.contains(&s));
        if let Some(s) = source {
            let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
            let n = sources.entry(s).or_insert(0);
            if self.per_source > 0 && *n >= self.per_source {
                drop(sources);
                return Err(self.refuse(Some(s)));
            }
            *n += 1;
        }
        if !reserved {
            let n = self.open.fetch_add(1, Ordering::AcqRel);
            if n >= self.max {
                self.open.fetch_sub(1, Ordering::AcqRel);
                self.release(source);
                return Err(self.refuse(None));
            }
        }
        Ok(Guarded {
            inner: io,
            idle: self.idle,
            deadline: Box::pin(tokio::time::sleep(self.idle)),
            limits: self.clone(),
            source,
            capped: !reserved,
        })
    }

    fn release(&self, source: Option<IpAddr>) {
        let Some(s) = source else { return };
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = sources.get_mut(&s) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                sources.remove(&s);
            }
        }
    }
}

/// A connection counted against the limits, closed when idle.
pub struct Guarded<I> {
    inner: I,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limits: Arc<Limits>,
    source: Option<IpAddr>,
    /// Counted against the cap (its source is not reserved).
    capped: bool,
}

impl<I> Drop for Guarded<I> {
    fn drop(&mut self) {
        if self.capped {
            self.limits.open.fetch_sub(1, Ordering::AcqRel);
        }
        self.limits.release(self.source);
    }
}

impl<I> Guarded<I> {
    fn active(&mut self) {
        self.deadline.as_mut().reset(tokio::time::Instant::now() + self.idle);
    }

    /// A pending operation past the deadline: the connection is closed.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn idle_error() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "idle connection closed")
}

impl<I: AsyncRead + Unpin> AsyncRead for Guarded<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(r)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Guarded<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An acceptor that admits each TCP connection under [`Limits`] by its
/// peer's address, then hands it to `inner` (TLS, or none).
#[derive(Clone)]
pub struct Admit<A> {
    inner: A,
    limits: Arc<Limits>,
}

impl<A> Admit<A> {
    pub fn new(inner: A, limits: Arc<Limits>) -> Admit<A> {
        Admit { inner, limits }
    }
}

impl<A, S> axum_server::accept::Accept<tokio::net::TcpStream, S> for Admit<A>
where
    A: axum_server::accept::Accept<Guarded<tokio::net::TcpStream>, S> + Clone + Send + 'static,
    A::Future: Send + 'static,
    S: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = futures_util::future::BoxFuture<'static, std::io::Result<(A::Stream, A::Service)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        let admitted = match stream.peer_addr() {
            Ok(peer) => self.limits.admit_from(peer.ip(), stream),
            Err(e) => Err(e),
        };
        let inner = self.inner.clone();
        Box::pin(async move { inner.accept(admitted?, service).await })
    }
}

/// A listening socket whose queue of connections not yet accepted holds
/// `backlog` (a burst never sits unaccepted, neither counted nor refused).
pub fn listener(addr: std::net::SocketAddr, backlog: usize) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket
        .listen(u32::try_from(backlog).unwrap_or(u32::MAX).clamp(128, 65_535))?
        .into_std()
}

/// Gives hyper its timer, so a request head must arrive within [`IDLE`]
/// (without a timer hyper's header-read timeout never fires).
pub fn http1_timeouts<A: axum_server::Address>(server: &mut axum_server::Server<A, impl Sized>) {
    server
        .http_builder()
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(IDLE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn per_source_limit_and_reserved_sources() -> Result<(), Box<dyn std::error::Error>> {
        let a: IpAddr = "198.18.0.50".parse()?;
        let node: IpAddr = "198.18.0.11".parse()?;
        let l = Limits::with_sources(3, IDLE, 2, [node]);
        let a1 = l.admit_from(a, ())?;
        let _a2 = l.admit_from(a, ())?;
        assert!(l.admit_from(a, ()).is_err(), "a third from one address");
        assert_eq!(l.open_from(a), 2);
        // The node is outside the cap, which one more other fills.
        let _b = l.admit_from("198.18.0.51".parse()?, ())?;
        assert!(l.admit_from("198.18.0.52".parse()?, ()).is_err(), "past the cap");
        let _n1 = l.admit_from(node, ())?;
        let _n2 = l.admit_from(node, ())?;
        assert!(l.admit_from(node, ()).is_err(), "a node has its per-source limit");
        assert_eq!(l.open(), 3);
        drop(a1);
        assert_eq!((l.open(), l.open_from(a)), (2, 1));
        // An IPv4-mapped address is the same source.
        let _a3 = l.admit_from("::ffff:198.18.0.50".parse()?, ())?;
        assert_eq!(l.open_from(a), 2);
        Ok(())
    }
}
