//! What keeps unauthenticated clients from taking the API server down: a
//! cap on open connections (one more is closed at once, with a log line at
//! most every 10 s) and an idle timeout under TLS (a connection that sends
//! and receives nothing for [`IDLE`] is closed, before or after its
//! handshake). Hyper's own header-read timeout bounds a slow request head.

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

/// The open connections and their cap.
#[derive(Debug)]
pub struct Limits {
    max: usize,
    idle: Duration,
    open: AtomicUsize,
    warned: Mutex<Option<Instant>>,
}

impl Limits {
    pub fn new(max: usize, idle: Duration) -> Arc<Limits> {
        Arc::new(Limits {
            max,
            idle,
            open: AtomicUsize::new(0),
            warned: Mutex::new(None),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// `io` counted and watched for idleness, or refused at the cap.
    pub fn admit<I>(self: &Arc<Self>, io: I) -> std::io::Result<Guarded<I>> {
        let n = self.open.fetch_add(1, Ordering::AcqRel);
        if n >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            if warned.is_none_or(|w| w.elapsed() > Duration::from_secs(10)) {
                *warned = Some(Instant::now());
                tracing::warn!(
                    "{} connections are open, the most this server takes (--max-connections): new ones are closed at once until some end (idle ones end after {} s)",
                    self.max,
                    self.idle.as_secs()
                );
            }
            return Err(std::io::Error::other("connection cap reached"));
        }
        Ok(Guarded {
            inner: io,
            idle: self.idle,
            deadline: Box::pin(tokio::time::sleep(self.idle)),
            limits: self.clone(),
        })
    }
}

/// A connection counted against the cap, closed when idle.
pub struct Guarded<I> {
    inner: I,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limits: Arc<Limits>,
}

impl<I> Drop for Guarded<I> {
    fn drop(&mut self) {
        self.limits.open.fetch_sub(1, Ordering::AcqRel);
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
