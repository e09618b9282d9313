//! The command connection's guard. The redis crate's parser waits for whatever length a reply
//! declares and buffers it all, and caps nothing: a hostile server or proxy declaring a
//! terabyte could grow our memory for as long as the command timeout lets it. So the cache
//! opens the connections itself (`dial`: TCP, TLS with the same verification the crate would
//! do, Unix sockets) and hands the crate a stream whose reads pass through a `Scanner` first:
//! a declared length over Redis's own ceiling, nesting deeper than any reply we ask for, or
//! bytes that are not RESP fail the read at once, and the crate drops the connection (its
//! commands fail as I/O errors; the tier replaces it). A Cluster's nodes: see `node.rs`, and
//! for their TLS `cluster_tls.rs`.

mod cluster_tls;
mod dial;
mod node;
mod scan;

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use cluster_tls::{register as register_cluster_tls, ClusterTls};
pub use dial::{open, open_pubsub, tls_config};
pub use node::{cluster_connect_timeout, GuardedNode};
pub use scan::{Scanner, WireError};

/// A stream whose input is scanned before the redis crate reads it.
pub struct Guarded<S> {
    inner: S,
    scan: Scanner,
    failed: Option<WireError>,
}

impl<S> Guarded<S> {
    pub fn new(inner: S) -> Self {
        Guarded {
            inner,
            scan: Scanner::default(),
            failed: None,
        }
    }
}

/// Aborted, as the redis crate counts a dropped connection: it drops it at once (an error it
/// takes for recoverable would be polled again) and gives this reason to the first request.
fn refused(why: WireError) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!("the connection was closed: the server sent {why}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.failed {
            return Poll::Ready(Err(refused(why)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Err(why) = this.scan.feed(&buf.filled()[before..]) {
            // Nothing of this read reaches the parser: the connection ends here.
            buf.set_filled(before);
            this.failed = Some(why);
            return Poll::Ready(Err(refused(why)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_read_delivers_nothing_and_stays_refused() {
        let (client, mut server) = tokio::io::duplex(4096);
        let mut guarded = Guarded::new(client);
        server.write_all(b"+OK\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 5);
        server
            .write_all(b":1\r\n$1000000000000\r\nxxxx")
            .await
            .unwrap();
        let e = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        assert!(e.to_string().contains("512 MiB"), "{e}");
        server.write_all(b"+OK\r\n").await.unwrap();
        assert!(guarded.read(&mut buf).await.is_err(), "refused for good");
    }

    /// A server that answers the crate's handshake, then answers the first command with a
    /// declared terabyte and streams filler until its writes fail: how much filler it sent.
    pub(super) async fn terabyte_server(
        mut server: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        sent: Arc<AtomicU64>,
    ) {
        let mut commands = Scanner::default();
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok(n) = server.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            let before = commands.replies;
            commands.feed(&buf[..n]).expect("the crate sends RESP");
            for i in before..commands.replies {
                // CLIENT SETINFO LIB-NAME and LIB-VER, then the command.
                if i < 2 {
                    server.write_all(b"+OK\r\n").await.unwrap();
                    continue;
                }
                server.write_all(b"$1000000000000\r\n").await.unwrap();
                let filler = vec![b'x'; 64 * 1024];
                // At most 256 MiB: without the guard, the crate would take it all.
                for _ in 0..4096 {
                    if server.write_all(&filler).await.is_err() {
                        return;
                    }
                    sent.fetch_add(filler.len() as u64, Ordering::Relaxed);
                }
                return;
            }
        }
    }

    /// The crate's multiplexed connection over a guarded stream: a declared terabyte fails the
    /// command as an I/O error after a few of the server's chunks, not at the response timeout,
    /// and the connection is closed (its next command fails too).
    #[tokio::test(flavor = "current_thread")]
    async fn a_declared_terabyte_closes_the_connection_at_once() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let sent = Arc::new(AtomicU64::new(0));
        let serving = tokio::spawn(terabyte_server(server, sent.clone()));
        let info = redis::RedisConnectionInfo::default();
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
        let (mut conn, driver) =
            redis::aio::MultiplexedConnection::new_with_config(&info, Guarded::new(client), config)
                .await
                .unwrap();
        tokio::spawn(driver);
        let started = std::time::Instant::now();
        let got: redis::RedisResult<redis::Value> =
            redis::cmd("GET").arg("k").query_async(&mut conn).await;
        let e = got.unwrap_err();
        serving.await.unwrap();
        // Unguarded, the crate buffers all 256 MiB and fails only when the server gives up.
        assert!(
            sent.load(Ordering::Relaxed) < 4 * 1024 * 1024,
            "filler sent before the connection closed: {}",
            sent.load(Ordering::Relaxed)
        );
        assert!(
            e.is_io_error() || e.is_connection_dropped(),
            "an I/O failure: {e}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "well before the response timeout"
        );
        let again: redis::RedisResult<redis::Value> =
            redis::cmd("PING").query_async(&mut conn).await;
        assert!(again.is_err(), "the connection is closed");
    }
}
