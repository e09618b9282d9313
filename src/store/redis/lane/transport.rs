//! How a read lane connects to its target (`target.rs`): the TCP, TLS or Unix socket connection
//! and the handshake, all on the runtime; the socket is then handed to the embedder as
//! non-blocking.

use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use redis::io::tcp::socket2;
use redis::{RedisError, RedisResult};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::resp::{frame, Reply};
use crate::store::redis::target::{LaneTarget, LaneTls};
use crate::sync::LockOrRecover;

/// A lane's socket: TCP, or a Unix socket's.
pub enum LaneStream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl io::Read for &LaneStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            LaneStream::Tcp(s) => (&*s).read(buf),
            #[cfg(unix)]
            LaneStream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl io::Write for &LaneStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            LaneStream::Tcp(s) => (&*s).write(buf),
            #[cfg(unix)]
            LaneStream::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(unix)]
impl std::os::fd::AsRawFd for LaneStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            LaneStream::Tcp(s) => s.as_raw_fd(),
            LaneStream::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// An open lane's socket (non-blocking), its TLS session if it has one, and the tier's command
/// connection count when it began to open.
pub struct LaneSocket {
    pub stream: LaneStream,
    pub tls: Option<Box<rustls::ClientConnection>>,
    pub opened_at_replacement: u64,
}

/// Where a lane opening on the runtime leaves its result for the embedder's thread (the open
/// socket; or, for the socket lane, where to connect).
pub type Opened<T = LaneSocket> = Arc<std::sync::Mutex<Option<RedisResult<T>>>>;

/// The opening task's hold on `Opened`. Dropped without a result (the task panicked or was
/// dropped), it leaves a failure, so the embedder retries later instead of waiting for ever.
pub struct Landing<T = LaneSocket> {
    result: Opened<T>,
    landed: bool,
}

impl<T> Landing<T> {
    pub fn new(result: Opened<T>) -> Landing<T> {
        Landing {
            result,
            landed: false,
        }
    }

    pub fn land(mut self, opened: RedisResult<T>) {
        *self.result.lock_or_recover() = Some(opened);
        self.landed = true;
    }
}

impl<T> Drop for Landing<T> {
    fn drop(&mut self) {
        if !self.landed {
            *self.result.lock_or_recover() = Some(Err(RedisError::from(io::Error::other(
                "the read lane's opening ended without a result",
            ))));
        }
    }
}

/// Sends the handshake's commands and reads their replies; a refusal of a required one refuses
/// the lane.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    target: &LaneTarget,
) -> RedisResult<()> {
    let handshake = target.handshake();
    let mut out = Vec::new();
    for (cmd, _) in &handshake {
        cmd.write_packed_command(&mut out);
    }
    stream.write_all(&out).await?;
    stream.flush().await?;
    let mut input = Vec::new();
    let mut answered = 0;
    while answered < handshake.len() {
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(refused("Redis closed the connection".into()));
        }
        input.extend_from_slice(&chunk[..n]);
        while answered < handshake.len() {
            let Some((reply, len)) =
                frame(&input).map_err(|_| refused("Redis answered out of protocol".into()))?
            else {
                break;
            };
            handshake_reply(reply, handshake[answered].1).map_err(refused)?;
            answered += 1;
            input.drain(..len);
        }
    }
    Ok(())
}

/// Whether a handshake reply lets the lane open: a refusal of a `required` command does not.
pub fn handshake_reply(reply: Reply<'_>, required: bool) -> Result<(), String> {
    match (reply, required) {
        (Reply::Error(e), true) => Err(format!(
            "Redis refused the connection: {}",
            String::from_utf8_lossy(e)
        )),
        _ => Ok(()),
    }
}

pub(super) fn refused(what: String) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::ConnectionRefused, what))
}

/// Connects to `target`, over TLS if it says so, and runs the handshake: the socket, ready for
/// the embedder (non-blocking). `replacement`: the tier's command connection count when the
/// opening began.
pub async fn connect(target: &LaneTarget, replacement: u64) -> RedisResult<LaneSocket> {
    if let Some(path) = &target.path {
        return connect_unix(path, target, replacement).await;
    }
    let mut stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await?;
    stream.set_nodelay(true)?;
    // A replaced lane's unsent reads are discarded rather than delivered late.
    socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))?;
    let (stream, tls) = match &target.tls {
        None => {
            handshake(&mut stream, target).await?;
            (stream, None)
        }
        Some(LaneTls { name, config }) => {
            let config = config
                .clone()
                .ok_or_else(|| refused("no TLS configuration for the lane".into()))?;
            let name = ServerName::try_from(name.clone())
                .map_err(|e| refused(format!("invalid TLS server name: {e}")))?;
            let mut session = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await?;
            handshake(&mut session, target).await?;
            // The session goes on by hand on the embedder's loop; whatever it has read and not
            // yet delivered stays in it.
            let (stream, session) = session.into_inner();
            (stream, Some(Box::new(session)))
        }
    };
    let stream = stream.into_std()?;
    stream.set_nonblocking(true)?;
    Ok(LaneSocket {
        stream: LaneStream::Tcp(stream),
        tls,
        opened_at_replacement: replacement,
    })
}

/// `connect` to a Unix socket at `path`.
#[cfg(unix)]
async fn connect_unix(
    path: &str,
    target: &LaneTarget,
    replacement: u64,
) -> RedisResult<LaneSocket> {
    let mut stream = tokio::net::UnixStream::connect(path).await?;
    handshake(&mut stream, target).await?;
    let stream = stream.into_std()?;
    stream.set_nonblocking(true)?;
    Ok(LaneSocket {
        stream: LaneStream::Unix(stream),
        tls: None,
        opened_at_replacement: replacement,
    })
}

#[cfg(not(unix))]
async fn connect_unix(_: &str, _: &LaneTarget, _: u64) -> RedisResult<LaneSocket> {
    Err(refused("no Unix sockets here".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ConnectionInfo;

    #[test]
    fn an_opening_that_ends_without_a_result_lands_a_failure() {
        let result: Opened = Arc::new(std::sync::Mutex::new(None));
        // The opening task panics: its landing is dropped while unwinding.
        let landing = Landing::new(result.clone());
        let task = std::thread::spawn(move || {
            let _landing = landing;
            panic!("the opening panicked (expected by this test)");
        });
        assert!(task.join().is_err());
        let landed = result.lock().unwrap().take();
        assert!(matches!(landed, Some(Err(e)) if e.to_string().contains("without a result")));

        // A result that landed is the one read; dropping the landing after it does not write
        // again (the embedder has taken the result by then).
        Landing::new(result.clone()).land(Err(io::Error::other("refused").into()));
        let landed = result.lock().unwrap().take();
        assert!(matches!(landed, Some(Err(e)) if e.to_string().contains("refused")));
        assert!(result.lock().unwrap().is_none());
    }

    /// More replies in one read than the handshake asked for (a misbehaving proxy, say): the
    /// lane opens on the ones it asked for and never indexes past them.
    #[tokio::test(flavor = "current_thread")]
    async fn replies_past_the_handshake_do_not_break_it() {
        let info: ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:6390").unwrap();
        let target = LaneTarget::of(&info).unwrap();
        assert_eq!(target.handshake().len(), 2, "CLIENT SETNAME and ECHO");
        let (mut client, mut server) = tokio::io::duplex(4096);
        server.write_all(b"+OK\r\n+OK\r\n+OK\r\n").await.unwrap();
        assert!(handshake(&mut client, &target).await.is_ok());
        let mut asked = vec![0u8; 64];
        let n = server.read(&mut asked).await.unwrap();
        assert!(asked[..n].starts_with(b"*2\r\n$4\r\nECHO"));
    }
}
