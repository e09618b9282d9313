//! Opening a guarded command connection: what the redis crate's `Client` does when it connects
//! (resolve, TCP with our settings, TLS, Unix sockets; then the crate's own handshake and
//! multiplexing), with the stream wrapped in a `Guarded` between the socket (or the TLS
//! session) and the crate's parser.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_ok;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::io::tcp::socket2;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisError, RedisResult};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::Guarded;
use crate::policy::TlsOptions;
use crate::store::redis::net::tcp_settings;
use crate::store::redis::topology::rustls_client;

trait Stream: AsyncRead + AsyncWrite + Send + Sync {}
impl<S: AsyncRead + AsyncWrite + Send + Sync> Stream for S {}

/// The TLS client the redis crate would build from these options (its `create_rustls_config`):
/// the private CA or the system roots (a failure to load them refuses TLS), the client
/// certificate; with `insecure` (`rejectUnauthorized: false`) no verification and no SNI.
pub fn tls_config(tls: &TlsOptions, insecure: bool) -> Result<rustls::ClientConfig, String> {
    let mut config = rustls_client(tls, false)?;
    if insecure {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .ok_or_else(|| "no crypto provider for rustls".to_string())?;
        config.enable_sni = false;
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(NoVerification {
                supported: provider.signature_verification_algorithms,
            }));
    }
    Ok(config)
}

/// `rejectUnauthorized: false`: any certificate, as the redis crate's insecure mode.
#[derive(Debug)]
struct NoVerification {
    supported: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.supported.supported_schemes()
    }
}

/// One TCP connection to `addr`, with the settings every connection has (`tcp_settings`; the
/// crate cannot be asked for its linger time, which `tcp_settings` sets to zero).
async fn tcp(addr: std::net::SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    let settings = tcp_settings();
    stream.set_nodelay(settings.nodelay())?;
    let socket = socket2::SockRef::from(&stream);
    if let Some(keepalive) = settings.keepalive() {
        socket.set_tcp_keepalive(keepalive)?;
    }
    socket.set_linger(Some(Duration::ZERO))?;
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    socket.set_tcp_user_timeout(settings.user_timeout())?;
    Ok(stream)
}

/// TCP to every address `host` resolves to at once; the first to connect is kept.
async fn tcp_to(host: &str, port: u16) -> io::Result<TcpStream> {
    let addrs: Vec<_> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} resolves to no address"),
        ));
    }
    Ok(select_ok(addrs.into_iter().map(|a| Box::pin(tcp(a))))
        .await?
        .0)
}

/// The connected stream `info` names. `address`: where to connect when the host is the
/// certificate's name (`tls.servername`), as the command connection's resolver did.
async fn stream(
    info: &ConnectionInfo,
    tls: Option<&Arc<rustls::ClientConfig>>,
    address: Option<(&str, &str)>,
) -> RedisResult<Pin<Box<dyn Stream>>> {
    let reach = |host: &str| -> String {
        match address {
            Some((name, address)) if name == host => address.to_string(),
            _ => host.to_string(),
        }
    };
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => Ok(Box::pin(tcp_to(&reach(host), *port).await?)),
        ConnectionAddr::TcpTls { host, port, .. } => {
            let config = tls.cloned().ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "TLS without a client configuration",
                ))
            })?;
            let name = ServerName::try_from(host.clone()).map_err(|e| {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "invalid TLS server name",
                    e.to_string(),
                ))
            })?;
            let socket = tcp_to(&reach(host), *port).await?;
            let session = tokio_rustls::TlsConnector::from(config)
                .connect(name, socket)
                .await?;
            Ok(Box::pin(session))
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => Ok(Box::pin(tokio::net::UnixStream::connect(path).await?)),
        #[cfg(not(unix))]
        ConnectionAddr::Unix(_) => Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Unix sockets are not available on this platform",
        ))),
        _ => Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "an address kind this cache does not connect to",
        ))),
    }
}

/// A RESP2 pub/sub connection to `info` (a sentinel's: sentinels need not speak RESP3), its
/// input guarded, within `connect_timeout` (the connection, TLS and the crate's handshake).
pub async fn open_pubsub(
    info: &ConnectionInfo,
    tls: Option<&Arc<rustls::ClientConfig>>,
    address: Option<(&str, &str)>,
    connect_timeout: Duration,
) -> RedisResult<PubSub> {
    let opening = async {
        let stream = stream(info, tls, address).await?;
        PubSub::new(info.redis_settings(), Guarded::new(stream)).await
    };
    match tokio::time::timeout(connect_timeout, opening).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connecting timed out").into()),
    }
}

/// A multiplexed command connection to `info`, its input guarded, within `connect_timeout`
/// (the connection, TLS and the crate's handshake: AUTH, SELECT, HELLO).
pub async fn open(
    info: &ConnectionInfo,
    tls: Option<&Arc<rustls::ClientConfig>>,
    address: Option<(&str, &str)>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
) -> RedisResult<MultiplexedConnection> {
    let opening = async {
        let stream = stream(info, tls, address).await?;
        let (conn, driver) = MultiplexedConnection::new_with_config(
            info.redis_settings(),
            Guarded::new(stream),
            config,
        )
        .await?;
        // The driver ends when every handle to the connection is dropped or its stream fails.
        tokio::spawn(driver);
        Ok(conn)
    };
    match tokio::time::timeout(connect_timeout, opening).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connecting timed out").into()),
    }
}
