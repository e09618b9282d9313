//! Where Redis is and how to reach it: one server (`redis`, `rediss`, `valkey`, `valkeys`,
//! `unix` URLs, with user, password and db in the URL), a Sentinel-managed primary, or a Redis
//! Cluster; TLS with system roots, a private CA, client certificates, a server name to verify,
//! or no verification. The redis crate does the work (rustls, `cluster_async`); this module
//! configures it, finds the Sentinel master itself (the crate's lookup takes no stream, so its
//! connections could not be guarded), and hands out command connections and bus subscriptions.
//!
//! Under Sentinel it also keeps where the master is: learned from the sentinels when a
//! connection is first made or after one failed, and from what `sentinel.rs` hears of a
//! failover (an announcement, or a poll); every connection goes there, and must find a node
//! whose ROLE is master. A change of master is counted (`moves`), so that whatever still talks
//! to the old one is replaced.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::io::AsyncDNSResolver;
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, Pipeline, ProtocolVersion, RedisError, RedisFuture, RedisResult, Role,
    ServerErrorKind, TlsCertificates, TlsMode, Value,
};
use tokio::sync::watch;

use super::guard;
use super::net::{tcp_settings, timed_out};
use super::target::LaneTarget;
use crate::sync::LockOrRecover;

pub use crate::policy::{RedisConfig, TlsOptions};

mod tls;
pub(super) use tls::rustls_client;
use tls::*;

/// One command connection.
#[derive(Clone)]
pub enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection<guard::GuardedNode>),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// One node of a cluster, by the address the cluster gives it (`None`: the one server).
pub type Node = Option<(String, u16)>;

impl Connection {
    /// Sends `pipe` to `node` of a cluster, all of it on that node's connection, or as any other
    /// pipeline (`None`, or not a cluster). For commands that name no key, like SCAN, which a
    /// cluster answers node by node, with the `ECHO` that proves their replies' places.
    pub async fn pipeline_on(&mut self, pipe: &Pipeline, node: &Node) -> RedisResult<Vec<Value>> {
        match (self, node) {
            (Connection::Cluster(c), Some((host, port))) => {
                let routing = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                c.route_pipeline(pipe.clone(), 0, pipe.len(), routing).await
            }
            (conn, _) => pipe.query_async(conn).await,
        }
    }

    /// Sends `pipe` (`ignore_errors` set: error replies are values) in one round trip to the
    /// node that serves `key`'s slot as the Cluster client knows it, whatever slots its other
    /// commands name: the client would refuse a pipeline whose keys span slots (its
    /// `route_for_pipeline`), while a node serves any key of any slot it holds and answers
    /// MOVED or ASK for the others. The client follows such a redirect itself, sending the
    /// whole pipeline there, at most `retries` times, then fails with the last one. Off a
    /// Cluster, the pipeline as any other.
    pub async fn pipeline_by(&mut self, pipe: Pipeline, key: &[u8]) -> RedisResult<Vec<Value>> {
        match self {
            Connection::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let count = pipe.len();
                c.route_pipeline(pipe, 0, count, SingleNodeRoutingInfo::SpecificNode(route))
                    .await
            }
            conn => pipe.query_async(conn).await,
        }
    }

    /// Sends `pipe` to one node (any, on a cluster): for a keyless question, like
    /// `CLUSTER SLOTS`, and the `ECHO` after it, which must travel on one connection.
    pub async fn pipeline_anywhere(&mut self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        match self {
            Connection::Cluster(c) => {
                c.route_pipeline(pipe.clone(), 0, pipe.len(), SingleNodeRoutingInfo::Random)
                    .await
            }
            conn => pipe.query_async(conn).await,
        }
    }
}

/// The masters of a cluster, from its `CLUSTER SLOTS` reply, each once (`slots::addresses`:
/// read with bounds); `Err`: why the reply is refused.
pub fn masters_of(slots: &Value) -> Result<Vec<Node>, &'static str> {
    super::slots::addresses(slots, false).map(|a| a.into_iter().map(Some).collect())
}

/// A node's address as the sentinels give it.
pub type Address = (String, u16);

/// Where the Sentinel master was last learned to be.
#[derive(Default)]
struct Followed {
    /// `None` until the sentinels were first asked.
    at: Option<Address>,
    /// The sentinels' config epoch of the answer followed (the fallback lookup, `find_master`,
    /// names none and keeps it): an answer of an older epoch is a sentinel that has not heard
    /// of the failover yet, and is not followed back.
    epoch: u64,
    /// A connection there failed: the next one asks the sentinels again.
    stale: bool,
}

enum Kind {
    /// One server, named by `info` (the URL with the server name swapped in for TLS).
    Single { info: ConnectionInfo },
    /// The primary the sentinels name: asked when none is known or a connection failed, and
    /// followed across failovers (`sentinel.rs`).
    Sentinel {
        master_name: String,
        /// Each sentinel, with the credentials and TLS the redis crate's client uses, for the
        /// announcements of failovers and the asks of the master's address.
        sentinels: Vec<ConnectionInfo>,
        /// How the master is reached at an address: the URL's user, password, db and scheme.
        node: Box<ConnectionInfo>,
        followed: std::sync::Mutex<Followed>,
    },
    /// A cluster; the bus subscribes on one node (plain PUBLISH reaches every node).
    Cluster {
        client: Box<ClusterClient>,
        seeds: Vec<ConnectionInfo>,
        /// The TLS its nodes are opened with, registered for them (`guard::ClusterTls`).
        node_tls: Option<Arc<guard::ClusterTls>>,
    },
}

pub struct Topology {
    kind: Kind,
    tls: Option<TlsOptions>,
    /// The read lane's TLS client configuration, made from `tls` when a lane first opens.
    lane_tls: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// The command connections' and the bus's, made when the first one opens (see `guarded`).
    command_tls: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// The URL's host, for `tls.servername` (connect there, verify the name).
    resolver: Option<Arc<ServerNameResolver>>,
    db: i64,
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    /// How many times the master moved (Sentinel): the bus resubscribes on a change.
    moves: watch::Sender<u64>,
}

impl Topology {
    /// A Redis Cluster: a pipeline must stay within one slot there.
    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster { .. })
    }

    /// The topology `config` describes, or why it cannot be used: a message that quotes no
    /// password (`RedisConfig::scrub` over what the redis crate says) and no TLS material.
    pub fn new(config: &RedisConfig) -> Result<Topology, String> {
        Self::build(config).map_err(|why| config.scrub(&why))
    }

    fn build(config: &RedisConfig) -> Result<Topology, String> {
        if let Some(tls) = &config.tls {
            check_tls_material(tls)?;
        }
        // rustls needs a process-wide crypto provider; another library may have installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = (config.tls.is_some() || config.tls_wanted()).then(|| {
            config.tls.clone().unwrap_or(TlsOptions {
                reject_unauthorized: true,
                ..Default::default()
            })
        });
        let info_of = |url: &str| url.into_connection_info().map_err(|e| e.to_string());
        let mut resolver = None;
        let (kind, db) = if !config.cluster.is_empty() {
            let seeds: Vec<ConnectionInfo> = config
                .cluster
                .iter()
                .map(|u| info_of(u))
                .collect::<Result<_, _>>()?;
            let mut builder = ClusterClientBuilder::new(seeds.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.command_timeout)
                .tcp_settings(tcp_settings())
                // Failovers take seconds; commands are bounded by the tier's own timeout, so the
                // cluster client's retries stay short and the tier degrades meanwhile.
                .retries(2)
                .min_retry_wait(50)
                .max_retry_wait(200);
            if let Some(tls) = &tls {
                builder = builder
                    .tls(if tls.reject_unauthorized {
                        TlsMode::Secure
                    } else {
                        TlsMode::Insecure
                    })
                    .certs(certificates(tls));
            }
            let client = Box::new(builder.build().map_err(|e| e.to_string())?);
            let node_tls = match &tls {
                Some(tls) => Some(register_cluster_tls(&seeds, tls).map_err(|e| e.to_string())?),
                None => None,
            };
            (
                Kind::Cluster {
                    client,
                    seeds,
                    node_tls,
                },
                0,
            )
        } else if !config.sentinels.is_empty() {
            let primary = match &config.url {
                Some(u) => Some(info_of(u)?),
                None => None,
            };
            let sentinels: Vec<ConnectionInfo> = config
                .sentinels
                .iter()
                .map(|u| info_of(u))
                .collect::<Result<_, _>>()?;
            let master_name = config.master_name.clone().unwrap_or_default();
            let db = primary.as_ref().map_or(0, |p| p.redis_settings().db());
            // As the redis crate's Sentinel client does: the first sentinel's credentials for
            // every sentinel.
            let credentials = sentinels
                .first()
                .map(|f| f.redis_settings().clone().set_db(0))
                .unwrap_or_default();
            let sentinels = sentinels
                .into_iter()
                .map(|s| {
                    s.set_redis_settings(credentials.clone())
                        .set_tcp_settings(tcp_settings())
                })
                .collect();
            // Without a URL: no credentials, db 0, plain TCP (the address is replaced).
            let node = match primary {
                Some(primary) => primary,
                None => ConnectionAddr::Tcp(String::new(), 0)
                    .into_connection_info()
                    .map_err(|e| e.to_string())?,
            };
            (
                Kind::Sentinel {
                    master_name,
                    sentinels,
                    node: Box::new(node),
                    followed: std::sync::Mutex::new(Followed::default()),
                },
                db,
            )
        } else {
            let url = config.url.as_deref().unwrap_or_default();
            let info = info_of(url)?;
            let db = info.redis_settings().db();
            if let (Some(tls), ConnectionAddr::TcpTls { host, .. }) = (&tls, info.addr()) {
                if let Some(name) = &tls.servername {
                    resolver = Some(Arc::new(ServerNameResolver {
                        servername: name.clone(),
                        address: host.clone(),
                    }));
                }
            }
            // Built once here so a bad certificate or key is reported at construction.
            client(info.clone(), tls.as_ref(), false).map_err(|e| e.to_string())?;
            (Kind::Single { info }, db)
        };
        Ok(Topology {
            kind,
            tls,
            lane_tls: std::sync::OnceLock::new(),
            command_tls: std::sync::OnceLock::new(),
            resolver,
            db,
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
            moves: watch::channel(0).0,
        })
    }

    /// The database index (the bus channel carries it).
    pub fn db(&self) -> i64 {
        self.db
    }

    fn config(&self, connect_timeout: Duration) -> AsyncConnectionConfig {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(self.command_timeout));
        match &self.resolver {
            Some(r) => config.set_dns_resolver(ServerNameResolver {
                servername: r.servername.clone(),
                address: r.address.clone(),
            }),
            None => config,
        }
    }

    /// A client for the one server commands go to now (the primary, for Sentinel: where it was
    /// last learned to be, or where the sentinels name it if none is known or a connection to
    /// it failed).
    async fn server(&self, resp3: bool) -> RedisResult<Client> {
        match &self.kind {
            Kind::Single { info } => client(info.clone(), self.tls.as_ref(), resp3),
            Kind::Sentinel { node, followed, .. } => {
                let known = {
                    let f = followed.lock_or_recover();
                    if f.stale {
                        None
                    } else {
                        f.at.clone()
                    }
                };
                let (host, port) = match known {
                    Some(at) => at,
                    None => {
                        // The sentinels' newest answer; the lookup the redis crate makes (which
                        // checks the node's ROLE, and says why it finds none) if none answers.
                        match self.ask_master().await {
                            Some((at, epoch)) => {
                                self.learned(at, Some(epoch));
                            }
                            None => {
                                let at = self.find_master().await?;
                                self.learned(at, None);
                            }
                        }
                        // Where it was followed to: an answer older than the one followed is not.
                        followed.lock_or_recover().at.clone().ok_or_else(|| {
                            RedisError::from((
                                ErrorKind::MasterNameNotFoundBySentinel,
                                "the sentinels name no master",
                            ))
                        })?
                    }
                };
                client(at(node, host, port), self.tls.as_ref(), resp3)
            }
            Kind::Cluster { .. } => unreachable!("a cluster has no one server"),
        }
    }

    /// Whether the master is found through sentinels.
    pub fn is_sentinel(&self) -> bool {
        matches!(self.kind, Kind::Sentinel { .. })
    }

    /// How many times the master moved, to watch for the next move.
    pub fn moves(&self) -> watch::Receiver<u64> {
        self.moves.subscribe()
    }

    /// How many times the master moved so far.
    pub fn moved(&self) -> u64 {
        *self.moves.borrow()
    }

    /// The master is at `at` (with the sentinels' config `epoch`, if known). True if that is a
    /// move from where it was (counted); an answer of an older epoch than the one followed
    /// changes nothing.
    pub fn learned(&self, at: Address, epoch: Option<u64>) -> bool {
        let Kind::Sentinel { followed, .. } = &self.kind else {
            return false;
        };
        let mut f = followed.lock_or_recover();
        if let Some(epoch) = epoch {
            if epoch < f.epoch {
                return false;
            }
            f.epoch = epoch;
        }
        f.stale = false;
        if f.at.as_ref() == Some(&at) {
            return false;
        }
        let moved = f.at.is_some();
        f.at = Some(at);
        drop(f);
        if moved {
            self.moves.send_modify(|n| *n += 1);
        }
        moved
    }

    /// A connection to the master failed: the next one asks the sentinels where it is.
    pub fn forget_master(&self) {
        if let Kind::Sentinel { followed, .. } = &self.kind {
            followed.lock_or_recover().stale = true;
        }
    }

    /// The master's name under Sentinel.
    pub fn master_name(&self) -> Option<&str> {
        match &self.kind {
            Kind::Sentinel { master_name, .. } => Some(master_name),
            _ => None,
        }
    }

    /// How many sentinels there are (none unless Sentinel).
    pub fn sentinel_count(&self) -> usize {
        match &self.kind {
            Kind::Sentinel { sentinels, .. } => sentinels.len(),
            _ => 0,
        }
    }

    /// A client for sentinel `index`, as the redis crate's sentinel client reaches it.
    fn sentinel_client(&self, index: usize) -> RedisResult<Option<(Client, &str)>> {
        let Kind::Sentinel {
            sentinels,
            master_name,
            ..
        } = &self.kind
        else {
            return Ok(None);
        };
        let Some(info) = sentinels.get(index) else {
            return Ok(None);
        };
        let client = match (info.addr(), &self.tls) {
            (ConnectionAddr::TcpTls { .. }, Some(tls)) => {
                Client::build_with_tls(info.clone(), certificates(tls))?
            }
            _ => Client::open(info.clone())?,
        };
        Ok(Some((client, master_name.as_str())))
    }

    /// Sentinel `index`'s announcements of a failover (`FAILOVER_CHANNELS`), subscribed within
    /// the connect timeout; the stream ends when the connection does.
    pub async fn failover_announcements(
        &self,
        index: usize,
    ) -> RedisResult<redis::aio::PubSubStream> {
        let Some((client, _)) = self.sentinel_client(index)? else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "no such sentinel",
            )));
        };
        // Opened by the guard, as command connections are: a sentinel's reply is no more
        // trusted than a master's.
        let subscribed = async {
            let info = client.get_connection_info();
            let (tls, address) = self.guard_route(info)?;
            let mut pubsub =
                guard::open_pubsub(info, tls.as_ref(), address, self.connect_timeout).await?;
            pubsub.subscribe(&FAILOVER_CHANNELS[..]).await?;
            RedisResult::Ok(pubsub.into_on_message())
        };
        tokio::time::timeout(self.connect_timeout, subscribed)
            .await
            .map_err(|_| timed_out("timed out subscribing on a sentinel"))?
    }

    /// Where the sentinels name the master now, and that answer's config epoch: every sentinel
    /// is asked, each within the command timeout, and the newest epoch among those that answer
    /// within `ASK_GRACE` of the first wins, so a sentinel that has not heard of a failover yet
    /// is outvoted by one that has, and a paused one delays nothing. The address is the one a
    /// sentinel gives its clients (`GET-MASTER-ADDR-BY-NAME`), which is the promoted replica's
    /// from its promotion on, before the switch is announced; the epoch (`SENTINEL MASTER`)
    /// changes at the promotion too. `None` if none answered.
    pub async fn ask_master(&self) -> Option<(Address, u64)> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut asks: FuturesUnordered<_> = (0..self.sentinel_count())
            .map(|index| async move {
                let (client, name) = self.sentinel_client(index).ok()??;
                let asked = async {
                    let config = self.config(self.connect_timeout);
                    let mut conn = self.guarded(&client, config, self.connect_timeout).await?;
                    redis::pipe()
                        .cmd("SENTINEL")
                        .arg("MASTER")
                        .arg(name)
                        .cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(name)
                        .query_async::<(std::collections::HashMap<String, String>, Address)>(
                            &mut conn,
                        )
                        .await
                };
                let (fields, at) = tokio::time::timeout(self.command_timeout, asked)
                    .await
                    .ok()?
                    .ok()?;
                let epoch = fields
                    .get("config-epoch")
                    .and_then(|e| e.parse::<u64>().ok())
                    .unwrap_or(0);
                Some((at, epoch))
            })
            .collect();
        let mut best: Option<(Address, u64)> = None;
        let mut until = None;
        loop {
            let next = match until {
                None => asks.next().await,
                Some(until) => match tokio::time::timeout_at(until, asks.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            match next {
                None => break,
                Some(None) => {}
                Some(Some(answer)) => {
                    until.get_or_insert_with(|| tokio::time::Instant::now() + ASK_GRACE);
                    if best.as_ref().is_none_or(|b| answer.1 > b.1) {
                        best = Some(answer);
                    }
                }
            }
        }
        best
    }

    /// The master as the redis crate's Sentinel lookup finds it, on guarded connections (a
    /// sentinel's reply is no more trusted than a master's): each sentinel, whose ROLE must say
    /// sentinel, lists its masters (`SENTINEL MASTERS`); the first, in the sentinels' order,
    /// named `masterName`, flagged master and not down (`s_down`, `o_down`), whose own ROLE says
    /// master, wins. For when no sentinel answered `ask_master`. Every sentinel is asked at
    /// once, each within the command timeout, each master checked within the connect and
    /// command timeouts, at most `MASTER_CANDIDATES` per sentinel. The error says for each
    /// sentinel why it named none, by address only (no URL, so no password).
    async fn find_master(&self) -> RedisResult<Address> {
        let Kind::Sentinel {
            sentinels, node, ..
        } = &self.kind
        else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "not a Sentinel topology",
            )));
        };
        let lookups = sentinels
            .iter()
            .enumerate()
            .map(|(index, info)| async move {
                let looked = async {
                    let (client, name) = self
                        .sentinel_client(index)
                        .map_err(|e| e.to_string())?
                        .ok_or("no such sentinel")?;
                    // One command at a time, as the crate asks: a pipeline whose connection
                    // the guard closes fails as a broken pipe, without the guard's reason.
                    let listed = async {
                        let config = self.config(self.connect_timeout);
                        let mut conn = self.guarded(&client, config, self.connect_timeout).await?;
                        let role: Role = redis::cmd("ROLE").query_async(&mut conn).await?;
                        if !matches!(role, Role::Sentinel { .. }) {
                            return Ok(None);
                        }
                        redis::cmd("SENTINEL")
                            .arg("MASTERS")
                            .query_async::<Vec<std::collections::HashMap<String, String>>>(
                                &mut conn,
                            )
                            .await
                            .map(Some)
                    };
                    let masters = tokio::time::timeout(self.command_timeout, listed)
                        .await
                        .map_err(|_| "timed out".to_string())?
                        .map_err(|e| e.to_string())?
                        .ok_or("not a sentinel (ROLE)")?;
                    let mut why = format!("names no master {:?} that is up", shown(name));
                    for (host, port) in named_masters(masters, name) {
                        let candidate = format!("{}:{port}", shown(&host));
                        match self.is_master_at(node, host.clone(), port).await {
                            Ok(true) => return Ok((host, port)),
                            Ok(false) => why = format!("names {candidate}, not a master (ROLE)"),
                            Err(e) => why = format!("names {candidate}: {e}"),
                        }
                    }
                    Err(why)
                };
                let place = address(info.addr()).map_or_else(
                    || format!("#{}", index + 1),
                    |(host, port)| format!("{}:{port}", shown(&host)),
                );
                looked
                    .await
                    .map_err(|why| format!("sentinel {place}: {why}"))
            });
        let mut whys = Vec::new();
        for looked in futures_util::future::join_all(lookups).await {
            match looked {
                Ok(at) => return Ok(at),
                Err(why) => whys.push(why),
            }
        }
        Err(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "no sentinel names a usable master",
            whys.join("; "),
        )))
    }

    /// Whether the node at `host:port`, reached as `node` says (credentials, db, TLS), answers
    /// ROLE as a master, within the connect and the command timeouts.
    async fn is_master_at(
        &self,
        node: &ConnectionInfo,
        host: String,
        port: u16,
    ) -> RedisResult<bool> {
        let client = client(at(node, host, port), self.tls.as_ref(), false)?;
        let config = self.config(self.connect_timeout);
        let mut conn = self.guarded(&client, config, self.connect_timeout).await?;
        let role = tokio::time::timeout(
            self.command_timeout,
            redis::cmd("ROLE").query_async::<Role>(&mut conn),
        )
        .await
        .map_err(|_| timed_out("timed out asking the master's ROLE"))??;
        Ok(matches!(role, Role::Primary { .. }))
    }

    /// A connection under Sentinel must reach a master: right after a failover the node the
    /// sentinels named a moment ago may already be, or be about to be, a replica.
    async fn confirm_master(&self, conn: &mut MultiplexedConnection) -> RedisResult<()> {
        if !self.is_sentinel() {
            return Ok(());
        }
        let role: Role = redis::cmd("ROLE").query_async(conn).await?;
        if matches!(role, Role::Primary { .. }) {
            return Ok(());
        }
        self.forget_master();
        Err(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "the node the sentinels named is not a master (ROLE)",
        )))
    }

    /// Whether a read lane (see `node/lane/`) may reach this server: one server or a Sentinel
    /// primary, over TCP, plain or TLS that verifies the server (`rejectUnauthorized: false`
    /// keeps reads on the command connection, whose client skips verification for it).
    pub fn lane_possible(&self) -> bool {
        if self.tls.as_ref().is_some_and(|t| !t.reject_unauthorized) {
            return false;
        }
        match &self.kind {
            Kind::Single { info } => match info.addr() {
                ConnectionAddr::Tcp(..) | ConnectionAddr::Unix(_) => true,
                ConnectionAddr::TcpTls { .. } => self.tls.is_some(),
                _ => false,
            },
            Kind::Sentinel { .. } => true,
            // A lane per node (`cluster_lane_target`), over plain TCP: a TLS node's
            // configuration is the crate's (see `guard::ClusterTls`).
            Kind::Cluster { node_tls, .. } => node_tls.is_none() && self.tls.is_none(),
        }
    }

    /// A Cluster node's read lane target: the node at `host`:`port` (from the slot map), as the
    /// first seed authenticates (db 0, as a cluster has). `None` off a cluster, or over TLS.
    pub fn cluster_lane_target(&self, host: &str, port: u16) -> Option<LaneTarget> {
        match &self.kind {
            Kind::Cluster {
                seeds, node_tls, ..
            } if node_tls.is_none() && self.tls.is_none() => {
                Some(LaneTarget::node(host, port, seeds.first()?))
            }
            _ => None,
        }
    }

    /// Where a read lane connects now: the one server, or the primary the sentinels name; over
    /// TLS, with the client configuration the command connection's options describe.
    pub async fn lane_target(&self) -> RedisResult<Option<LaneTarget>> {
        if !self.lane_possible() || self.is_cluster() {
            return Ok(None);
        }
        let client = self.server(false).await?;
        let Some(target) = LaneTarget::of(client.get_connection_info()) else {
            return Ok(None);
        };
        if !target.is_tls() {
            return Ok(Some(target));
        }
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        let config = self
            .lane_tls
            .get_or_init(|| lane_tls_config(tls).map(Arc::new))
            .clone()
            .map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "the read lane's TLS configuration",
                    e,
                ))
            })?;
        let ConnectionAddr::TcpTls { host, .. } = client.get_connection_info().addr() else {
            return Ok(None);
        };
        let host = host.clone();
        // With `tls.servername` the certificate's name stands in the address; connect where the
        // URL said, as the command connection's resolver does.
        let address = match &self.resolver {
            Some(r) if r.servername == host => r.address.clone(),
            _ => host,
        };
        Ok(Some(target.with_tls(config, address)))
    }

    /// A new command connection, within `connect_timeout`.
    pub async fn connect(&self, connect_timeout: Duration) -> RedisResult<Connection> {
        match &self.kind {
            Kind::Cluster {
                client,
                seeds,
                node_tls,
            } => {
                guard::cluster_connect_timeout(self.connect_timeout);
                let mut conn = Connection::Cluster(client.get_async_generic_connection().await?);
                if let Some(tls) = node_tls.as_ref().filter(|t| t.contested()) {
                    // Its nodes are told apart by address from another cluster's (see
                    // `guard::ClusterTls`): the ones it has now are claimed.
                    tls.claim(
                        cluster_nodes(&mut conn, &seeds[0])
                            .await
                            .iter()
                            .filter_map(|n| address(n.addr())),
                    );
                }
                Ok(conn)
            }
            _ => {
                let client = self.server(false).await?;
                let config = self.config(connect_timeout);
                let mut conn = self.guarded(&client, config, connect_timeout).await?;
                self.confirm_master(&mut conn).await?;
                Ok(Connection::Single(conn))
            }
        }
    }

    /// A connection to `client`'s server opened by the guard (`guard.rs`: no reply may declare
    /// more than Redis could send), with the TLS the redis crate would have made from `tls`.
    async fn guarded(
        &self,
        client: &Client,
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let info = client.get_connection_info();
        let (tls, address) = self.guard_route(info)?;
        guard::open(info, tls.as_ref(), address, config, connect_timeout).await
    }

    /// The TLS client (the one the redis crate would have made from `tls`) and the address
    /// `tls.servername` stands for, with which the guard opens a connection to `info`.
    #[allow(clippy::type_complexity)]
    fn guard_route(
        &self,
        info: &ConnectionInfo,
    ) -> RedisResult<(Option<Arc<rustls::ClientConfig>>, Option<(&str, &str)>)> {
        let tls = match info.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => Some(
                self.command_tls
                    .get_or_init(|| {
                        let tls = self.tls.clone().unwrap_or_default();
                        guard::tls_config(&tls, *insecure).map(Arc::new)
                    })
                    .clone()
                    .map_err(|e| {
                        redis::RedisError::from((
                            redis::ErrorKind::InvalidClientConfig,
                            "the TLS configuration",
                            e,
                        ))
                    })?,
            ),
            _ => None,
        };
        let address = self
            .resolver
            .as_ref()
            .map(|r| (r.servername.as_str(), r.address.as_str()));
        Ok((tls, address))
    }

    /// A connection subscribed to nothing yet whose push messages (RESP3) go to `pushes`: the
    /// bus. On a cluster, the `attempt`-th node in turn (seeds first, then the nodes the
    /// cluster names), since a plain PUBLISH reaches every node.
    pub async fn subscriber(
        &self,
        pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
        attempt: usize,
        command: Option<&mut Connection>,
    ) -> RedisResult<MultiplexedConnection> {
        let client = match &self.kind {
            Kind::Cluster { seeds, .. } => {
                let mut nodes = seeds.clone();
                if let Some(conn) = command {
                    nodes.extend(cluster_nodes(conn, &seeds[0]).await);
                }
                let info = nodes[attempt % nodes.len()].clone();
                client(info, self.tls.as_ref(), true)?
            }
            _ => self.server(true).await?,
        };
        let config = self.config(self.connect_timeout).set_push_sender(pushes);
        let mut conn = self.guarded(&client, config, self.connect_timeout).await?;
        self.confirm_master(&mut conn).await?;
        Ok(conn)
    }
}

/// The most masters one sentinel's list may name that `find_master` checks (a list is the
/// network's: a hostile one could name thousands).
const MASTER_CANDIDATES: usize = 4;

/// The masters named `name` in a `SENTINEL MASTERS` list that the redis crate would try
/// (flagged master, not subjectively or objectively down, with an address), each once, at most
/// `MASTER_CANDIDATES`.
fn named_masters(
    masters: Vec<std::collections::HashMap<String, String>>,
    name: &str,
) -> Vec<Address> {
    let mut out: Vec<Address> = Vec::new();
    for m in masters {
        let up = m.get("flags").is_some_and(|f| {
            let flags: Vec<&str> = f.split(',').collect();
            flags.contains(&"master") && !flags.contains(&"s_down") && !flags.contains(&"o_down")
        });
        let (Some(true), Some(ip), Some(Ok(port))) = (
            m.get("name").map(|n| n == name),
            m.get("ip"),
            m.get("port").map(|p| p.parse::<u16>()),
        ) else {
            continue;
        };
        let at = (ip.clone(), port);
        if up && !out.contains(&at) {
            out.push(at);
            if out.len() == MASTER_CANDIDATES {
                break;
            }
        }
    }
    out
}

/// Text from the network or the options, shortened for a message.
fn shown(text: &str) -> String {
    const MOST: usize = 64;
    match text.char_indices().nth(MOST) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// How long the other sentinels' answers are awaited once one answered (`ask_master`).
const ASK_GRACE: Duration = Duration::from_millis(100);

/// The sentinels' channels that name a new master: a replica promoted by a failover (the
/// sentinel names it to its clients from then on: `slave <ip:port> <ip> <port> @ <name> <old ip>
/// <old port>`), and the failover's end (`<name> <old ip> <old port> <new ip> <new port>`),
/// which every sentinel announces as it learns of it.
pub const FAILOVER_CHANNELS: [&str; 2] = ["+promoted-slave", "+switch-master"];

/// The new master an announcement on `channel` names, if it is `name`'s.
pub fn announced_master(channel: &str, payload: &str, name: &str) -> Option<Address> {
    let parts: Vec<&str> = payload.split(' ').collect();
    match (channel, parts.as_slice()) {
        ("+switch-master", [n, _, _, ip, port]) if *n == name => {
            Some((ip.to_string(), port.parse().ok()?))
        }
        ("+promoted-slave", ["slave", _, ip, port, "@", n, _, _]) if *n == name => {
            Some((ip.to_string(), port.parse().ok()?))
        }
        _ => None,
    }
}

/// A TCP address's host and port.
fn address(addr: &ConnectionAddr) -> Option<Address> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// `template` (user, password, db, scheme) at `host:port`.
fn at(template: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match template.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    template.clone().set_addr(addr)
}

/// The nodes a cluster names (`CLUSTER SLOTS`), addressed like `template` (scheme, user,
/// password); empty if it cannot be asked.
async fn cluster_nodes(conn: &mut Connection, template: &ConnectionInfo) -> Vec<ConnectionInfo> {
    let Ok(slots) = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Value>(conn)
        .await
    else {
        return Vec::new();
    };
    // A reply refused by the bounds names no node: the seeds are all that is claimed.
    let addresses = super::slots::addresses(&slots, true).unwrap_or_default();
    addresses
        .into_iter()
        .map(|(host, port)| {
            let addr = match template.addr() {
                ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: *insecure,
                    tls_params: None,
                },
                _ => ConnectionAddr::Tcp(host, port),
            };
            template.clone().set_addr(addr)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel_topology() -> Topology {
        let mut config = RedisConfig::from_url("redis://127.0.0.1:1");
        config.url = None;
        config.sentinels = vec!["redis://127.0.0.1:2".into(), "redis://127.0.0.1:3".into()];
        config.master_name = Some("mymaster".into());
        Topology::new(&config).expect("a sentinel topology")
    }

    /// A move is counted once per new address; a sentinel that has not heard of the failover
    /// (an older epoch) does not move the master back; the redis crate's lookup (no epoch) may.
    #[test]
    fn the_master_moves_only_to_a_new_address_of_an_epoch_not_older() {
        let t = sentinel_topology();
        let a = ("10.0.0.1".to_string(), 6379);
        let b = ("10.0.0.2".to_string(), 6379);
        assert!(
            !t.learned(a.clone(), Some(0)),
            "the first address is no move"
        );
        assert!(!t.learned(a.clone(), Some(0)));
        assert_eq!(t.moved(), 0);
        assert!(t.learned(b.clone(), Some(1)), "the promoted replica");
        assert_eq!(t.moved(), 1);
        assert!(
            !t.learned(a.clone(), Some(0)),
            "a lagging sentinel's answer"
        );
        assert_eq!(t.moved(), 1);
        t.forget_master();
        assert!(
            !t.learned(b.clone(), Some(1)),
            "asked again after a failure: same master"
        );
        assert_eq!(t.moved(), 1);
        assert!(t.learned(a, None), "the crate's lookup names no epoch");
        assert_eq!(t.moved(), 2);
        assert_eq!(t.sentinel_count(), 2);
        assert_eq!(t.master_name(), Some("mymaster"));
    }

    #[test]
    fn only_sentinel_masters_move() {
        let t = Topology::new(&RedisConfig::from_url("redis://127.0.0.1:1")).unwrap();
        assert!(!t.learned(("10.0.0.1".to_string(), 1), Some(5)));
        assert!(!t.learned(("10.0.0.2".to_string(), 1), Some(6)));
        assert_eq!(t.moved(), 0);
        assert_eq!(t.sentinel_count(), 0);
    }

    /// The fallback lookup's failure names each sentinel by address and why, never a URL or a
    /// password (the sentinels' nor the master's).
    #[tokio::test(flavor = "current_thread")]
    async fn the_fallback_lookup_says_why_by_address_and_quotes_no_password() {
        let mut config = RedisConfig::from_url("redis://:MasterPw0rd@127.0.0.1:1");
        config.sentinels = vec![
            "redis://:SentinelPw0rd@127.0.0.1:1".into(),
            "redis://:SentinelPw0rd@127.0.0.1:2".into(),
        ];
        config.master_name = Some("mymaster".into());
        config.connect_timeout = Duration::from_millis(500);
        config.command_timeout = Duration::from_millis(500);
        let t = Topology::new(&config).expect("a sentinel topology");
        let e = t.find_master().await.expect_err("no sentinel is up");
        assert_eq!(e.kind(), ErrorKind::MasterNameNotFoundBySentinel);
        let text = e.to_string();
        assert!(
            text.contains("sentinel 127.0.0.1:1: ") && text.contains("sentinel 127.0.0.1:2: "),
            "{text}"
        );
        assert!(
            !text.contains("Pw0rd") && !text.contains("redis://"),
            "{text}"
        );
    }

    /// The masters a sentinel's list names that the crate's lookup would try: the name asked,
    /// flagged master and not down, with a port; each once, at most `MASTER_CANDIDATES`.
    #[test]
    fn a_sentinel_list_names_the_masters_the_crate_would_try() {
        let entry = |name: &str, ip: &str, port: &str, flags: &str| {
            [("name", name), ("ip", ip), ("port", port), ("flags", flags)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let list = vec![
            entry("other", "10.0.0.9", "6379", "master"),
            entry("m", "10.0.0.1", "6379", "master,s_down"),
            entry("m", "10.0.0.2", "6379", "master,o_down"),
            entry("m", "10.0.0.3", "x", "master"),
            entry("m", "10.0.0.4", "6379", "slave"),
            entry("m", "10.0.0.5", "6379", "master"),
            entry("m", "10.0.0.5", "6379", "master"),
        ];
        assert_eq!(
            named_masters(list, "m"),
            vec![("10.0.0.5".to_string(), 6379)]
        );
        let many = (0..10)
            .map(|i| entry("m", &format!("10.0.1.{i}"), "6379", "master"))
            .collect();
        assert_eq!(named_masters(many, "m").len(), MASTER_CANDIDATES);
    }

    const MARK: &str = "S3cretKeyBodyQUJDREVGR0g";

    /// Bad PEM in every shape the PEM library quotes: the message names the option, never the
    /// material (neither as text nor as the byte list the library prints).
    #[test]
    fn tls_material_is_never_quoted() {
        let bytes = MARK.bytes().map(|b| b.to_string()).collect::<Vec<_>>();
        let shapes = [
            format!("-----BEGIN CERTIFICATE-----{MARK}-----END CERTIFICATE-----"),
            format!("-----BEGIN CERTIFICATE-----\n{MARK}!!*\n-----END CERTIFICATE-----\n"),
            format!("-----BEGIN CERTIFICATE-----\n{MARK}\n"),
            format!("-----BEGIN CERTIFICATE{MARK}\n"),
            MARK.to_string(),
        ];
        for pem in shapes {
            for tls in [
                TlsOptions {
                    ca: Some(pem.clone().into_bytes()),
                    ..Default::default()
                },
                TlsOptions {
                    cert: Some(pem.clone().into_bytes()),
                    key: Some(pem.replace("CERTIFICATE", "PRIVATE KEY").into_bytes()),
                    ..Default::default()
                },
            ] {
                let mut config = RedisConfig::from_url("rediss://127.0.0.1:1");
                config.tls = Some(tls.clone());
                let Err(why) = Topology::new(&config) else {
                    panic!("bad PEM accepted: {pem:?}")
                };
                assert!(why.starts_with("tls."), "{why}");
                assert!(
                    !why.contains(MARK) && !why.contains(&bytes[..8].join(", ")),
                    "{why}"
                );
                let Err(lane) = lane_tls_config(&tls) else {
                    panic!("bad PEM accepted by the lane: {pem:?}")
                };
                assert!(
                    !lane.contains(MARK) && !lane.contains(&bytes[..8].join(", ")),
                    "{lane}"
                );
            }
        }
    }
}
