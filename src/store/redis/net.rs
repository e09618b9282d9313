//! What every socket to Redis shares: its TCP settings, and a timeout as the I/O error the
//! failure classification takes down Redis for. A leaf, so the topology, the guarded dialer
//! and the lane use it without importing each other.

use std::time::Duration;

use redis::io::tcp::{socket2, TcpSettings};
use redis::RedisError;

/// TCP settings for every connection: keepalive probes notice a peer that vanished without a
/// FIN, TCP_USER_TIMEOUT notices data that is never acknowledged, and no lingering on close so
/// a replaced connection's unsent commands are discarded rather than delivered late.
pub fn tcp_settings() -> TcpSettings {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1));
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let keepalive = keepalive.with_retries(3);
    let settings = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive)
        .set_linger_time(Duration::ZERO);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let settings = settings.set_user_timeout(Duration::from_secs(5));
    settings
}

/// A timeout, as an I/O error (so `classify` takes Redis down for it).
pub fn timed_out(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}
