//! A Redis Cluster's node connections, opened through the guard. The crate makes them itself
//! (`ClusterConnection` calls `Connect::connect_with_config` for every node it finds), so the
//! guard goes in as the connection type. That call carries no context but the node's
//! `ConnectionInfo` and an `AsyncConnectionConfig` the crate gives no way to read, which
//! decides what can be covered:
//! - plain TCP nodes: guarded, within the longest connect timeout any cluster asked for;
//! - TLS nodes: the crate's TLS parameters are private (no CA, client certificate or
//!   verification choice can be read back), so the configuration is the one the node's cluster
//!   registered (`cluster_tls.rs`), found by what the node's `ConnectionInfo` carries; guarded
//!   too, verified as the crate would (the node's address from the cluster is the name the
//!   certificate must carry, as the crate checks it; `rejectUnauthorized: false`: nothing, no
//!   SNI). Only a node whose configuration cannot be told (see `cluster_tls.rs`) connects as the
//!   crate makes it, unguarded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::Connect;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, Value,
};

use super::cluster_tls::{self, Found};

/// The longest `connectTimeout` of the clusters in this process, in ms (see the module's note).
static CONNECT_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

/// Records a cluster's connect timeout before its first connection.
pub fn cluster_connect_timeout(timeout: Duration) {
    CONNECT_TIMEOUT_MS.fetch_max(timeout.as_millis() as u64, Ordering::Relaxed);
}

/// One node's connection.
#[derive(Clone)]
pub struct GuardedNode(MultiplexedConnection);

impl ConnectionLike for GuardedNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

impl Connect for GuardedNode {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        Box::pin(async move {
            let info = info.into_connection_info()?;
            let tls = match info.addr() {
                ConnectionAddr::TcpTls { .. } => match cluster_tls::lookup(&info) {
                    Found::One(tls) => Some(tls.config().map_err(|e| {
                        RedisError::from((
                            ErrorKind::InvalidClientConfig,
                            "the TLS configuration",
                            e,
                        ))
                    })?),
                    Found::Ambiguous | Found::Unknown => {
                        return MultiplexedConnection::connect_with_config(info, config)
                            .await
                            .map(GuardedNode);
                    }
                },
                _ => None,
            };
            let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS.load(Ordering::Relaxed).max(1));
            super::open(&info, tls.as_ref(), None, config, timeout)
                .await
                .map(GuardedNode)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TlsOptions;
    use cluster_tls::tests::{node_info, throwaway_pki, TempDir};
    use std::sync::Arc;

    /// A GET on `node`, whose server floods a declared terabyte (`serving`, counting into
    /// `sent`), fails, and the connection closed after a few chunks of the flood.
    async fn read_through_flood(
        node: &mut GuardedNode,
        serving: tokio::task::JoinHandle<()>,
        sent: &AtomicU64,
    ) {
        let got: redis::RedisResult<Value> = redis::cmd("GET").arg("k").query_async(node).await;
        assert!(got.is_err());
        serving.await.unwrap();
        assert!(
            sent.load(Ordering::Relaxed) < 64 * 1024 * 1024,
            "filler taken before the connection closed: {}",
            sent.load(Ordering::Relaxed)
        );
    }

    /// A TLS listener on 127.0.0.1 serving the certificate `throwaway_pki` made in `dir`, whose
    /// first connection is handed to `terabyte_server`. Its port, the CA, and the server task.
    async fn tls_terabyte_node(
        dir: &std::path::Path,
        sent: Arc<AtomicU64>,
    ) -> (u16, Vec<u8>, tokio::task::JoinHandle<()>) {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (ca, cert, key) = throwaway_pki(dir);
        let chain = CertificateDer::pem_slice_iter(&cert)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(&key).unwrap();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serving = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            // A client that refuses the certificate ends the handshake: nothing to serve.
            if let Ok(session) = acceptor.accept(socket).await {
                crate::store::redis::guard::tests::terabyte_server(session, sent).await;
            }
        });
        (port, ca, serving)
    }

    fn verifying(ca: Vec<u8>) -> TlsOptions {
        TlsOptions {
            ca: Some(ca),
            reject_unauthorized: true,
            ..Default::default()
        }
    }

    /// A TLS node as the cluster client connects it, its cluster's TLS registered as a cluster
    /// topology does: through the guard too, so a declared terabyte closes it after a few chunks
    /// of the flood (the crate's own connection would take all 256 MiB of it).
    #[tokio::test(flavor = "current_thread")]
    async fn a_cluster_tls_node_connection_is_guarded() {
        let dir = TempDir::new("node-tls");
        let sent = Arc::new(AtomicU64::new(0));
        let (port, ca, serving) = tls_terabyte_node(&dir.0, sent.clone()).await;
        let options = verifying(ca);
        let info = node_info(port, &options, None);
        let _registered = cluster_tls::register(&info, &[], &options, false);
        cluster_connect_timeout(Duration::from_secs(5));
        let config =
            AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
        let mut node = GuardedNode::connect_with_config(info, config)
            .await
            .expect("the TLS node connects, verified against the registered CA");
        read_through_flood(&mut node, serving, &sent).await;
    }

    /// The guarded TLS node verifies as the crate would: a certificate its cluster's CA did not
    /// sign is refused; with `rejectUnauthorized: false` nothing is verified.
    #[tokio::test(flavor = "current_thread")]
    async fn a_cluster_tls_node_is_verified_as_the_crate_would() {
        let (dir, other) = (TempDir::new("node-tls-v"), TempDir::new("node-tls-other"));
        let (other_ca, ..) = throwaway_pki(&other.0);
        for reject_unauthorized in [true, false] {
            let sent = Arc::new(AtomicU64::new(0));
            let (port, _, serving) = tls_terabyte_node(&dir.0, sent).await;
            let options = TlsOptions {
                reject_unauthorized,
                ..verifying(other_ca.clone())
            };
            let info = node_info(port, &options, None);
            let _registered = cluster_tls::register(&info, &[], &options, !reject_unauthorized);
            cluster_connect_timeout(Duration::from_secs(5));
            let connected =
                GuardedNode::connect_with_config(info, AsyncConnectionConfig::new()).await;
            if reject_unauthorized {
                let e = connected
                    .err()
                    .expect("an untrusted certificate is refused");
                assert!(e.to_string().contains("certificate"), "{e}");
            } else {
                assert!(connected.is_ok(), "nothing verified: {:?}", connected.err());
            }
            serving.abort();
        }
    }

    /// A plain-TCP node as the cluster client connects it: through the guard, so a declared
    /// terabyte closes it after a few chunks of the flood.
    #[tokio::test(flavor = "current_thread")]
    async fn a_cluster_node_connection_is_guarded() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = Arc::new(AtomicU64::new(0));
        let flooded = sent.clone();
        let serving = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            crate::store::redis::guard::tests::terabyte_server(socket, flooded).await;
        });
        cluster_connect_timeout(Duration::from_secs(5));
        let config =
            AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
        let mut node =
            GuardedNode::connect_with_config(format!("redis://127.0.0.1:{port}"), config)
                .await
                .unwrap();
        read_through_flood(&mut node, serving, &sent).await;
    }
}
