//! The read lane: a second connection to the one server (or the Sentinel primary), over TCP or
//! TLS, which the hot read path (a `GET` of a key's envelope) takes instead of the command
//! connection. The embedder drives its socket from its own event loop, so a read and its answer
//! cross no thread: on the command connection each read goes JS thread → runtime worker →
//! connection task → JS thread, and a profile put most of a sequential read's time in those
//! wake-ups (issue 12). Here live what needs no event loop: whether the lane may be used, how it
//! connects (on the runtime, then handed over as a non-blocking socket), the framing of its
//! replies, and what a reply means.
//!
//! The lane carries plain GETs only; everything else (a miss that must take the lock, an entry
//! with tags, an error reply) is asked again on the command connection, which knows how to
//! classify failures and wait. A lane that fails or times out takes the tier down as the
//! command connection would; one whose tier replaced its command connection since it opened is
//! dropped too, so both always reach the same server.

use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use redis::io::tcp::socket2;
use redis::{ConnectionAddr, ConnectionInfo, RedisError, RedisResult};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::envelopes::{usable, Misdelivered};
use super::{connection::timed_out, RedisTier, Remote};
use crate::inbox::{tag_bucket, Stamp};
use crate::key;

/// One reply, framed from the lane's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A bulk string (`$n`): the value.
    Bulk(&'a [u8]),
    /// A null bulk string or array (`$-1`, `*-1`): no such key.
    Nil,
    /// An error reply (`-...`), without the dash.
    Error(&'a [u8]),
    /// Anything else a GET does not answer with (a status, an integer).
    Other,
}

/// The longest bulk reply the lane waits for: Redis's own ceiling for a string (512 MiB).
pub const MAX_BULK_LEN: i64 = 512 * 1024 * 1024;

/// The input is not RESP2 as a GET is answered: the lane cannot know where the next reply
/// starts, or the reply cannot be one it asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError;

/// The first reply in `buf` and its length in bytes, or `None` if it is not complete yet.
pub fn frame(buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>, ProtocolError> {
    let Some(len) = frame_len(buf, 0)? else {
        return Ok(None);
    };
    let line_end = line(buf, 1)?.expect("a framed reply has its first line");
    let reply = match buf[0] {
        b'$' if buf[1] == b'-' => Reply::Nil,
        b'$' => Reply::Bulk(&buf[line_end + 2..len - 2]),
        b'*' if buf[1] == b'-' => Reply::Nil,
        b'-' => Reply::Error(&buf[1..line_end]),
        _ => Reply::Other,
    };
    Ok(Some((reply, len)))
}

/// Where the line starting at `from` ends (its `\r`), if it has ended.
fn line(buf: &[u8], from: usize) -> Result<Option<usize>, ProtocolError> {
    // Headers are short; a very long one is not RESP.
    let window = &buf[from.min(buf.len())..buf.len().min(from + 4096)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(at) => Ok(Some(from + at)),
        None if window.len() >= 4096 => Err(ProtocolError),
        None => Ok(None),
    }
}

fn number(bytes: &[u8]) -> Result<i64, ProtocolError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtocolError)
}

/// The length of the reply starting at `at`, if it is complete.
fn frame_len(buf: &[u8], at: usize) -> Result<Option<usize>, ProtocolError> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = line(buf, at + 1)? else {
        return Ok(None);
    };
    let after_line = end + 2;
    match kind {
        b'+' | b'-' | b':' => Ok(Some(after_line - at)),
        b'$' => {
            let n = number(&buf[at + 1..end])?;
            if n < 0 {
                return Ok(Some(after_line - at));
            }
            // Redis never sends more (proto-max-bulk-len's ceiling); waiting for more would
            // let the other end grow our memory at will.
            if n > MAX_BULK_LEN {
                return Err(ProtocolError);
            }
            let total = after_line + n as usize + 2;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[total - 2..total] != b"\r\n" {
                return Err(ProtocolError);
            }
            Ok(Some(total - at))
        }
        // A null array is how RESP2 servers may say nil. Any other array, a RESP3 type or a push
        // frame is no reply to a GET or to the handshake's commands: out of protocol, so the
        // lane is closed before it looks inside (no recursion, however deep the nesting).
        b'*' if number(&buf[at + 1..end])? < 0 => Ok(Some(after_line - at)),
        _ => Err(ProtocolError),
    }
}

/// What a lane read found.
#[derive(Debug, PartialEq)]
pub enum LaneRead {
    Found(Remote),
    /// No entry this cache can use (none, another serializer's, expired, dead): a miss, as the
    /// command connection's read would say.
    Missing,
    /// Ask again on the command connection: an entry with tags (their clocks are read there),
    /// the bus down (the clear clock is read there), an error reply.
    Ask,
    /// The reply cannot be this read's: another key's entry, or a reply a GET never gives. The
    /// lane is out of step with its requests: it is closed, and this read and every one after
    /// it are asked again on the command connection.
    Misaligned(&'static str),
}

/// Where a lane connects, and as whom (its `Debug` never shows the password).
#[derive(Clone)]
pub struct LaneTarget {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// Over TLS: the name the server's certificate must carry (and SNI), and the client
    /// configuration (`with_tls`).
    tls: Option<LaneTls>,
}

impl std::fmt::Debug for LaneTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("tls", &self.tls.as_ref().map(|t| &t.name))
            .finish()
    }
}

#[derive(Clone)]
struct LaneTls {
    name: String,
    config: Option<Arc<rustls::ClientConfig>>,
}

impl LaneTarget {
    /// TCP servers, plain or TLS with verification; Unix sockets and unverified TLS stay on the
    /// command connection. A TLS target needs its configuration (`with_tls`) before it opens.
    pub fn of(info: &ConnectionInfo) -> Option<LaneTarget> {
        let (host, port, tls) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host, port, None),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                ..
            } => (
                host,
                port,
                Some(LaneTls {
                    name: host.clone(),
                    config: None,
                }),
            ),
            _ => return None,
        };
        let s = info.redis_settings();
        Some(LaneTarget {
            host: host.clone(),
            port: *port,
            username: s.username().map(str::to_string),
            password: s.password().map(str::to_string),
            db: s.db(),
            tls,
        })
    }

    /// Whether the lane speaks TLS to this server.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TLS target with its client configuration, connecting to `address` (the URL's host
    /// when `tls.servername` named the certificate) and verifying the certificate's name.
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>, address: String) -> LaneTarget {
        if let Some(tls) = &mut self.tls {
            tls.config = Some(config);
            self.host = address;
        }
        self
    }

    /// The commands that make a new connection ours: AUTH (ACL user or password), SELECT, and
    /// a name operators see in CLIENT LIST (refused by some ACLs: then it stays unnamed). Each
    /// with whether its refusal refuses the lane.
    fn handshake(&self) -> Vec<(redis::Cmd, bool)> {
        let mut out = Vec::new();
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            out.push((auth.arg(password).clone(), true));
        }
        if self.db != 0 {
            out.push((redis::cmd("SELECT").arg(self.db).clone(), true));
        }
        out.push((
            redis::cmd("CLIENT").arg("SETNAME").arg(LANE_NAME).clone(),
            false,
        ));
        out
    }
}

/// The lane's connection name (CLIENT LIST shows it).
pub const LANE_NAME: &str = "stampede-cache:read-lane";

/// An open lane's socket (non-blocking), its TLS session if it has one, and the tier's command
/// connection count when it began to open.
pub struct LaneSocket {
    pub stream: TcpStream,
    pub tls: Option<Box<rustls::ClientConnection>>,
    pub opened_at_replacement: u64,
}

/// Where a lane opening on the runtime leaves its result for the embedder's thread.
pub type Opened = Arc<std::sync::Mutex<Option<RedisResult<LaneSocket>>>>;

/// The opening task's hold on `Opened`. Dropped without a result (the task panicked or was
/// dropped), it leaves a failure, so the embedder retries later instead of waiting for ever.
pub struct Landing {
    result: Opened,
    landed: bool,
}

impl Landing {
    pub fn new(result: Opened) -> Landing {
        Landing {
            result,
            landed: false,
        }
    }

    pub fn land(mut self, opened: RedisResult<LaneSocket>) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(opened);
        self.landed = true;
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if !self.landed {
            *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(Err(RedisError::from(
                io::Error::other("the read lane's opening ended without a result"),
            )));
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
            if let (Reply::Error(e), true) = (reply, handshake[answered].1) {
                return Err(refused(format!(
                    "Redis refused the connection: {}",
                    String::from_utf8_lossy(e)
                )));
            }
            answered += 1;
            input.drain(..len);
        }
    }
    Ok(())
}

fn refused(what: String) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::ConnectionRefused, what))
}

impl RedisTier {
    /// Whether reads may take the lane now: a plain-TCP server, Redis up, the bus up (an entry
    /// without tags is then alive unless an announcement said otherwise), not closed.
    pub fn lane_usable(&self) -> bool {
        self.link.topology.lane_possible() && !self.closed() && self.bus_up() && self.redis_up()
    }

    /// How long a read on the lane may take: the command timeout.
    pub fn lane_timeout(&self) -> Duration {
        self.link.command_timeout
    }

    /// Whether a lane opened at `replacement` still reaches the command connection's server.
    pub fn lane_current(&self, replacement: u64) -> bool {
        self.link.replacements() == replacement
    }

    /// Opens a lane (on the runtime), within the connect timeout.
    pub async fn open_lane(&self) -> RedisResult<LaneSocket> {
        let replacement = self.link.replacements();
        let connect_timeout = self.link.connect_timeout;
        let opened = async {
            let target = self
                .link
                .topology
                .lane_target()
                .await?
                .ok_or_else(|| refused("the server is not reached over TCP".into()))?;
            let mut stream =
                tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await?;
            stream.set_nodelay(true)?;
            // A replaced lane's unsent reads are discarded rather than delivered late.
            socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))?;
            let (stream, tls) = match &target.tls {
                None => {
                    handshake(&mut stream, &target).await?;
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
                    handshake(&mut session, &target).await?;
                    // The session goes on by hand on the embedder's loop; whatever it has
                    // read and not yet delivered stays in it.
                    let (stream, session) = session.into_inner();
                    (stream, Some(Box::new(session)))
                }
            };
            let stream = stream.into_std()?;
            stream.set_nonblocking(true)?;
            Ok(LaneSocket {
                stream,
                tls,
                opened_at_replacement: replacement,
            })
        };
        tokio::time::timeout(connect_timeout, opened)
            .await
            .map_err(|_| timed_out("timed out connecting to Redis"))?
    }

    /// The request of a lane read of `key`, appended to `out`.
    pub fn lane_request(&self, key: &str, out: &mut Vec<u8>) {
        key::write_value_get(&self.namespace, key, out);
    }

    /// What the lane's reply to a read means. `stamp`: the key's invalidation stamp
    /// when the read was asked for; `count`: a `get()`, counted as an l2Hit or a miss (an `Ask`
    /// is counted where it is asked again).
    pub fn lane_answer(&self, key: &str, stamp: Stamp, reply: Reply<'_>, count: bool) -> LaneRead {
        let read = match reply {
            Reply::Nil => LaneRead::Missing,
            Reply::Error(_) => return LaneRead::Ask,
            Reply::Other => {
                self.stats.redis_errors.incr();
                return LaneRead::Misaligned(
                    "Redis answered a GET on the read lane with a reply a GET never gives",
                );
            }
            Reply::Bulk(bytes) => match usable(bytes, self.serializer, &self.value_key(key)) {
                Err(Misdelivered) => {
                    self.stats.redis_errors.incr();
                    return LaneRead::Misaligned(
                        "Redis answered a GET on the read lane with another key's entry",
                    );
                }
                Ok(None) => LaneRead::Missing,
                Ok(Some(found)) => {
                    let buckets: Vec<u16> = found.tags.iter().map(|t| tag_bucket(t)).collect();
                    if self.inbox.dead(found.envelope.born, &buckets) {
                        LaneRead::Missing
                    } else if !found.tags.is_empty() || !self.bus_up() {
                        return LaneRead::Ask;
                    } else {
                        LaneRead::Found(found.remote(stamp))
                    }
                }
            },
        };
        if count {
            match read {
                LaneRead::Found(_) => self.stats.l2_hits.incr(),
                _ => self.stats.misses.incr(),
            }
        }
        read
    }

    /// A read on the lane outlived the command timeout: Redis is down, as the command
    /// connection's timeout would say, until a probe answers (the reads it carried, asked again,
    /// are then served without Redis at once).
    pub fn lane_timed_out(&self, key: Option<&str>, why: String) {
        self.went_down("get", key, why);
    }

    /// The lane's connection failed (closed, reset, out of protocol): reported, but Redis is not
    /// taken down for it. The reads it carried are asked again on the command connection, whose
    /// own failure, if Redis is gone, takes the tier down; a lane killed alone costs nothing.
    pub fn lane_lost(&self, key: Option<&str>, why: String) {
        self.report("get", key, why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    #[test]
    fn frames_the_replies_a_get_gives() {
        assert_eq!(frame(b"$3\r\nabc\r\n"), Ok(Some((Reply::Bulk(b"abc"), 9))));
        assert_eq!(frame(b"$0\r\n\r\n+OK\r\n"), Ok(Some((Reply::Bulk(b""), 6))));
        assert_eq!(frame(b"$-1\r\n$1\r\n"), Ok(Some((Reply::Nil, 5))));
        assert_eq!(
            frame(b"-WRONGTYPE Operation\r\n"),
            Ok(Some((Reply::Error(b"WRONGTYPE Operation"), 22)))
        );
        assert_eq!(frame(b"+OK\r\n"), Ok(Some((Reply::Other, 5))));
        assert_eq!(frame(b":12\r\n"), Ok(Some((Reply::Other, 5))));
        assert_eq!(frame(b"*-1\r\n"), Ok(Some((Reply::Nil, 5))));
    }

    #[test]
    fn an_incomplete_reply_waits_for_more_at_every_cut() {
        let bulk: &[u8] = b"$10\r\n0123456789\r\n";
        for cut in 0..bulk.len() {
            assert_eq!(frame(&bulk[..cut]), Ok(None), "cut at {cut}");
        }
        // A value holding CRLF is framed by its length, not by its lines.
        assert_eq!(
            frame(b"$4\r\na\r\nb\r\n"),
            Ok(Some((Reply::Bulk(b"a\r\nb"), 10)))
        );
    }

    #[test]
    fn input_that_is_not_resp_is_refused() {
        assert_eq!(frame(b"hello\r\n"), Err(ProtocolError));
        assert_eq!(frame(b"$x\r\n"), Err(ProtocolError));
        assert_eq!(frame(b"$3\r\nabcde\r\n"), Err(ProtocolError));
        assert_eq!(frame(&[b'+'; 5000]), Err(ProtocolError));
    }

    #[test]
    fn replies_no_get_gives_are_refused_before_they_are_read() {
        // Arrays (however deep), RESP3 types and push frames: refused at their first line.
        assert_eq!(frame(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"), Err(ProtocolError));
        let deep = "*1\r\n".repeat(300_000);
        assert_eq!(frame(deep.as_bytes()), Err(ProtocolError));
        assert_eq!(frame(b"*1\r\n"), Err(ProtocolError), "even incomplete");
        for kind in [b'%', b'~', b'>', b'_', b'#', b',', b'(', b'=', b'|'] {
            let mut reply = vec![kind];
            reply.extend_from_slice(b"1\r\n");
            assert_eq!(frame(&reply), Err(ProtocolError), "kind {}", kind as char);
        }
        // A declared length past Redis's own ceiling is never waited for.
        assert_eq!(frame(b"$1000000000000\r\n"), Err(ProtocolError));
        assert_eq!(frame(b"$9223372036854775807\r\n"), Err(ProtocolError));
        assert_eq!(
            frame(b"$536870912\r\nabc"),
            Ok(None),
            "at the ceiling: waits"
        );
        assert_eq!(frame(b"$536870913\r\n"), Err(ProtocolError));
    }

    /// Cases per property: `FUZZ_CASES` (`npm run fuzz` sets many more), else 25,000.
    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(25_000)
    }

    /// What a GET (or the handshake) may be answered with, as bytes, and as `frame` reads it.
    fn replies() -> impl proptest::strategy::Strategy<Value = (Vec<u8>, Reply<'static>)> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|v| {
                let mut out = format!("${}\r\n", v.len()).into_bytes();
                out.extend_from_slice(&v);
                out.extend_from_slice(b"\r\n");
                // Leaked for a 'static reply: test data only.
                (out, Reply::Bulk(Box::leak(v.into_boxed_slice())))
            }),
            Just((b"$-1\r\n".to_vec(), Reply::Nil)),
            Just((b"*-1\r\n".to_vec(), Reply::Nil)),
            proptest::collection::vec(b'A'..=b'z', 0..40).prop_map(|e| {
                let e = String::from_utf8(e).unwrap_or_default();
                let out = format!("-{e}\r\n").into_bytes();
                (
                    out,
                    Reply::Error(Box::leak(e.into_bytes().into_boxed_slice())),
                )
            }),
            Just((b"+OK\r\n".to_vec(), Reply::Other)),
            (0i64..1_000_000).prop_map(|n| (format!(":{n}\r\n").into_bytes(), Reply::Other)),
        ]
    }

    /// Frames `input` to the end the way the lane does: replies in order, then whether it
    /// stopped on a protocol error.
    fn frame_all(input: &[u8]) -> (Vec<Reply<'_>>, usize, bool) {
        let mut at = 0;
        let mut out = Vec::new();
        loop {
            match frame(&input[at..]) {
                Ok(Some((reply, len))) => {
                    assert!(len > 0 && at + len <= input.len());
                    out.push(reply);
                    at += len;
                }
                Ok(None) => return (out, at, false),
                Err(ProtocolError) => return (out, at, true),
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(cases()))]

        /// Any bytes at all: an answer, a wait, or a refusal; never a panic or a runaway.
        #[test]
        fn any_bytes_frame_without_panicking(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = frame_all(&input);
        }

    }

    proptest::proptest! {
        // A tenth of the cases: each is 20 times dearer to generate in a debug build.
        #![proptest_config(proptest::test_runner::Config::with_cases(cases() / 10))]

        /// RESP-shaped noise (headers, lengths, nesting, CRLFs in odd places).
        #[test]
        fn resp_shaped_noise_frames_without_panicking(parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("*".to_string()), proptest::strategy::Just("$".to_string()),
                proptest::strategy::Just("\r\n".to_string()), proptest::strategy::Just("-".to_string()),
                proptest::strategy::Just(">".to_string()), proptest::strategy::Just("%".to_string()),
                proptest::prelude::any::<u64>().prop_map(|n| n.to_string()),
                (-999i64..1000).prop_map(|n| n.to_string()),
                proptest::strategy::Just("x".to_string()),
            ], 0..64)) {
            let input = parts.concat();
            let _ = frame_all(input.as_bytes());
        }

        /// Replies a GET can get, back to back and delivered in any cuts: framed whole, in order,
        /// each at the first moment it is complete.
        #[test]
        fn replies_frame_alike_however_they_are_cut(
            sent in proptest::collection::vec(replies(), 1..8),
            cut in 0usize..4096,
        ) {
            let bytes: Vec<u8> = sent.iter().flat_map(|(b, _)| b.clone()).collect();
            let expected: Vec<&Reply<'static>> = sent.iter().map(|(_, r)| r).collect();
            let cut = cut % (bytes.len() + 1);
            let (first, used, failed) = frame_all(&bytes[..cut]);
            proptest::prop_assert!(!failed);
            let (rest, used_rest, failed) = frame_all(&bytes[used..]);
            proptest::prop_assert!(!failed);
            proptest::prop_assert_eq!(used + used_rest, bytes.len());
            let all: Vec<&Reply<'_>> = first.iter().chain(rest.iter()).collect();
            proptest::prop_assert_eq!(all, expected);
        }
    }

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
        assert_eq!(target.handshake().len(), 1, "CLIENT SETNAME only");
        let (mut client, mut server) = tokio::io::duplex(4096);
        server.write_all(b"+OK\r\n+OK\r\n+OK\r\n").await.unwrap();
        assert!(handshake(&mut client, &target).await.is_ok());
        let mut asked = vec![0u8; 64];
        let n = server.read(&mut asked).await.unwrap();
        assert!(asked[..n].starts_with(b"*3\r\n$6\r\nCLIENT"));
    }

    #[test]
    fn the_handshake_authenticates_and_selects() {
        let info: ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info("redis://app:secret@127.0.0.1:6390/3")
                .unwrap();
        let target = LaneTarget::of(&info).unwrap();
        assert!(!format!("{target:?}").contains("secret"), "{target:?}");
        let packed: Vec<(Vec<u8>, bool)> = target
            .handshake()
            .iter()
            .map(|(c, required)| (c.get_packed_command(), *required))
            .collect();
        assert_eq!(
            packed,
            vec![
                (
                    b"*3\r\n$4\r\nAUTH\r\n$3\r\napp\r\n$6\r\nsecret\r\n".to_vec(),
                    true
                ),
                (b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n".to_vec(), true),
                (
                    b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$24\r\nstampede-cache:read-lane\r\n"
                        .to_vec(),
                    false
                ),
            ]
        );
        let tls: ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info("rediss://127.0.0.1:6390").unwrap();
        assert!(LaneTarget::of(&tls).unwrap().is_tls());
        assert!(!target.is_tls());
        let insecure: ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info("rediss://127.0.0.1:6390/#insecure")
                .unwrap();
        assert!(LaneTarget::of(&insecure).is_none());
    }
}
