//! A Redis Cluster's node connections, opened through the guard. The crate makes them itself
//! (`ClusterConnection` calls `Connect::connect_with_config` for every node it finds), so the
//! guard goes in as the connection type. That call carries no context but the node's
//! `ConnectionInfo` and an `AsyncConnectionConfig` the crate gives no way to read, which
//! decides what can be covered:
//! - plain TCP nodes: guarded, within the longest connect timeout any cluster asked for;
//! - TLS nodes: their TLS parameters are private to the crate (no CA, client certificate or
//!   verification choice can be read back), so they connect as the crate makes them, unguarded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::Connect;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisFuture, Value,
};

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
            if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
                return MultiplexedConnection::connect_with_config(info, config)
                    .await
                    .map(GuardedNode);
            }
            let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS.load(Ordering::Relaxed).max(1));
            super::open(&info, None, None, config, timeout)
                .await
                .map(GuardedNode)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
        let got: redis::RedisResult<Value> =
            redis::cmd("GET").arg("k").query_async(&mut node).await;
        assert!(got.is_err());
        serving.await.unwrap();
        assert!(
            sent.load(Ordering::Relaxed) < 64 * 1024 * 1024,
            "filler taken before the connection closed: {}",
            sent.load(Ordering::Relaxed)
        );
    }
}
