//! Where a read lane connects and as whom (host, port, credentials, db, TLS), taken from the
//! command connection's, and the commands that make a new connection ours. A leaf: the
//! topology hands targets out and the lane dials them, so neither imports the other.

use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo};

/// Where a lane connects, and as whom (its `Debug` never shows the password).
#[derive(Clone)]
pub struct LaneTarget {
    pub(super) host: String,
    pub(super) port: u16,
    /// A Unix socket's path (`host` and `port` are then unused).
    pub(super) path: Option<String>,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// Over TLS: the name the server's certificate must carry (and SNI), and the client
    /// configuration (`with_tls`).
    pub(super) tls: Option<LaneTls>,
}

impl std::fmt::Debug for LaneTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("path", &self.path)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("tls", &self.tls.as_ref().map(|t| &t.name))
            .finish()
    }
}

#[derive(Clone)]
pub(super) struct LaneTls {
    pub(super) name: String,
    pub(super) config: Option<Arc<rustls::ClientConfig>>,
}

impl LaneTarget {
    /// TCP servers, plain or TLS with verification, and Unix sockets; unverified TLS stays on
    /// the command connection. A TLS target needs its configuration (`with_tls`) before it opens.
    pub fn of(info: &ConnectionInfo) -> Option<LaneTarget> {
        let (host, port, tls) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host, port, None),
            ConnectionAddr::Unix(path) => {
                let s = info.redis_settings();
                return Some(LaneTarget {
                    host: String::new(),
                    port: 0,
                    path: Some(path.to_string_lossy().into_owned()),
                    username: s.username().map(str::to_string),
                    password: s.password().map(str::to_string),
                    db: s.db(),
                    tls: None,
                });
            }
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
            path: None,
            username: s.username().map(str::to_string),
            password: s.password().map(str::to_string),
            db: s.db(),
            tls,
        })
    }

    /// A Cluster node at `host`:`port`, reached as `seed` authenticates (plain TCP, db 0).
    pub fn node(host: &str, port: u16, seed: &ConnectionInfo) -> LaneTarget {
        let s = seed.redis_settings();
        LaneTarget {
            host: host.to_string(),
            port,
            path: None,
            username: s.username().map(str::to_string),
            password: s.password().map(str::to_string),
            db: 0,
            tls: None,
        }
    }

    /// Whether the lane speaks TLS to this server.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Where the socket lane connects: a Unix socket's path, or a TCP host and port.
    pub fn address(&self) -> (&str, u16, Option<&str>) {
        (&self.host, self.port, self.path.as_deref())
    }

    /// The handshake's commands, packed, and whether each one's refusal refuses the lane.
    pub fn handshake_packed(&self) -> (Vec<u8>, Vec<bool>) {
        let mut out = Vec::new();
        let required = self
            .handshake()
            .iter()
            .map(|(cmd, required)| {
                cmd.write_packed_command(&mut out);
                *required
            })
            .collect();
        (out, required)
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
    pub(super) fn handshake(&self) -> Vec<(redis::Cmd, bool)> {
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
        // The lane ends each batch of reads with an ECHO (its alignment mark): a server or
        // an ACL that refuses it refuses the lane, so reads stay on the command connection.
        out.push((redis::cmd("ECHO").arg(LANE_NAME).clone(), true));
        out.push((
            redis::cmd("CLIENT").arg("SETNAME").arg(LANE_NAME).clone(),
            false,
        ));
        out
    }
}

/// The lane's connection name (CLIENT LIST shows it).
pub const LANE_NAME: &str = "stampede-cache:read-lane";

#[cfg(test)]
mod tests {
    use super::*;

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
                    b"*2\r\n$4\r\nECHO\r\n$24\r\nstampede-cache:read-lane\r\n".to_vec(),
                    true
                ),
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
    /// A Unix socket is a target of the socket lane: its path, and the same handshake (as one
    /// packed write, each command with whether its refusal refuses the lane).
    #[test]
    fn a_unix_socket_is_reached_by_its_path_with_the_same_handshake() {
        let info: ConnectionInfo = redis::IntoConnectionInfo::into_connection_info(
            "unix:///tmp/redis.sock?db=2&pass=secret",
        )
        .unwrap();
        let target = LaneTarget::of(&info).unwrap();
        assert_eq!(target.address().2, Some("/tmp/redis.sock"));
        assert!(!target.is_tls());
        assert!(!format!("{target:?}").contains("secret"), "{target:?}");
        let (hello, required) = target.handshake_packed();
        let each: Vec<u8> = target
            .handshake()
            .iter()
            .flat_map(|(c, _)| c.get_packed_command())
            .collect();
        assert_eq!(hello, each);
        assert_eq!(
            required,
            vec![true, true, true, false],
            "AUTH, SELECT, ECHO, SETNAME"
        );
    }
}
