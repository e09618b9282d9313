//! The TLS client configurations of the Redis Clusters in this process, for their node
//! connections (`node.rs`). The redis crate opens a cluster's nodes itself, through
//! `Connect::connect_with_config`, which hands over nothing but the node's `ConnectionInfo`:
//! its address, its credentials and the crate's TLS parameters, whose fields are private (no CA,
//! certificate or key can be read back). So each cluster topology registers here the TLS
//! options it gave the crate, under a key made of what a node's `ConnectionInfo` carries of
//! them: the `insecure` flag (`rejectUnauthorized: false`), the username, the password, and the
//! crate's TLS parameters as their `Debug` prints them (the client certificate chain, and how
//! many trust anchors; rustls elides the private key and prints no anchor), hashed with a key
//! drawn for this process. A node connection opens guarded, with the configuration registered
//! under its key.
//!
//! Two live clusters may register one key with different TLS material: two cluster caches in
//! one process with the same credentials, `rejectUnauthorized` and client certificate, whose
//! private CAs differ (the crate's parameters do not show which CA). Then the node's address
//! decides: each cluster claims the addresses of its seeds and of the nodes its cache has read
//! from `CLUSTER SLOTS` (at each connection, only while its key is shared so), and a node
//! claimed by one of them connects guarded with that one's configuration. A node no cluster
//! sharing the key claims yet (one the crate found before the cache asked, or two caches of one
//! cluster with different CAs), and one no live cluster registered at all (a cache closed while
//! the crate reconnects), connects as the crate makes it: unguarded, its replies still checked
//! by the key mark and by shape. Never with the configuration of another live cluster sharing
//! the key: that could accept a certificate the node's own cluster would refuse.
//!
//! Entries hold their configuration weakly: it goes with its topology, and dead entries are
//! pruned at every registration, so the registry never holds more than the live clusters; each
//! claims at most `MAX_CLAIMED` addresses.

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use redis::{ConnectionAddr, ConnectionInfo};

use super::dial::tls_config;
use crate::policy::TlsOptions;
use crate::sync::LockOrRecover;

/// The TLS a cluster gives its nodes: the options, and the client configuration the redis
/// crate would make of them, made at the first node connection.
pub struct ClusterTls {
    options: TlsOptions,
    insecure: bool,
    config: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// The addresses of this cluster's nodes known here (seeds, and `CLUSTER SLOTS` answers).
    claimed: Mutex<HashSet<(String, u16)>>,
    /// Its key in the registry (`None`: it holds no TLS node's).
    key: Option<u64>,
}

/// The most node addresses one cluster claims (a `CLUSTER SLOTS` reply is the network's).
const MAX_CLAIMED: usize = 4_096;

impl ClusterTls {
    /// Claims `addresses` as this cluster's nodes (see the module's note).
    pub fn claim(&self, addresses: impl IntoIterator<Item = (String, u16)>) {
        let mut claimed = self.claimed.lock_or_recover();
        for address in addresses {
            if claimed.len() >= MAX_CLAIMED {
                return;
            }
            claimed.insert(address);
        }
    }

    fn claims(&self, address: &(String, u16)) -> bool {
        self.claimed.lock_or_recover().contains(address)
    }

    /// Whether another live cluster registered different TLS material under this one's key:
    /// its nodes are then told apart by address only, and are worth claiming.
    pub fn contested(&self) -> bool {
        let Some(key) = self.key else {
            return false;
        };
        let material = material_of(&self.options, self.insecure);
        REGISTERED
            .lock_or_recover()
            .iter()
            .any(|e| e.key == key && e.material != material && e.tls.strong_count() > 0)
    }

    /// The client configuration (`guard::tls_config`), or why it cannot be made.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.config
            .get_or_init(|| tls_config(&self.options, self.insecure).map(Arc::new))
            .clone()
    }
}

struct Entry {
    key: u64,
    /// The TLS material itself, to tell an ambiguous key.
    material: u64,
    tls: Weak<ClusterTls>,
}

static REGISTERED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn hasher() -> impl Hasher {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::new).build_hasher()
}

/// The key of a node `info` names (`None`: not a TLS node).
fn key_of(info: &ConnectionInfo) -> Option<u64> {
    let ConnectionAddr::TcpTls {
        insecure,
        tls_params,
        ..
    } = info.addr()
    else {
        return None;
    };
    let mut h = hasher();
    insecure.hash(&mut h);
    info.redis_settings().username().hash(&mut h);
    info.redis_settings().password().hash(&mut h);
    format!("{tls_params:?}").hash(&mut h);
    Some(h.finish())
}

fn material_of(options: &TlsOptions, insecure: bool) -> u64 {
    let mut h = hasher();
    (&options.ca, &options.cert, &options.key, insecure).hash(&mut h);
    h.finish()
}

/// Registers the TLS of a cluster whose nodes the crate connects as `node` (any one of them,
/// as the crate makes its `ConnectionInfo`: credentials and TLS parameters), made from
/// `options` with `insecure`. Held by the topology for as long as the cluster lives.
pub fn register(
    node: &ConnectionInfo,
    seeds: &[ConnectionInfo],
    options: &TlsOptions,
    insecure: bool,
) -> Arc<ClusterTls> {
    let key = key_of(node);
    let tls = Arc::new(ClusterTls {
        options: options.clone(),
        insecure,
        config: OnceLock::new(),
        claimed: Mutex::new(HashSet::new()),
        key,
    });
    tls.claim(seeds.iter().filter_map(|s| address_of(s.addr())));
    if let Some(key) = key {
        let mut registered = REGISTERED.lock_or_recover();
        registered.retain(|e| e.tls.strong_count() > 0);
        registered.push(Entry {
            key,
            material: material_of(options, insecure),
            tls: Arc::downgrade(&tls),
        });
    }
    tls
}

/// What the registry knows of a node's TLS.
pub enum Found {
    /// The one configuration registered for it.
    One(Arc<ClusterTls>),
    /// Live clusters registered different material under its key.
    Ambiguous,
    /// No live cluster registered it (or it is not a TLS node).
    Unknown,
}

/// A TCP address's host and port.
fn address_of(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// The one material among `candidates`, with a configuration of it.
fn only_material(candidates: &[(u64, Arc<ClusterTls>)]) -> Option<Arc<ClusterTls>> {
    let (first, tls) = candidates.first()?;
    candidates
        .iter()
        .all(|(m, _)| m == first)
        .then(|| tls.clone())
}

/// The TLS configuration of the cluster node `info` names.
pub fn lookup(info: &ConnectionInfo) -> Found {
    let Some(key) = key_of(info) else {
        return Found::Unknown;
    };
    let candidates: Vec<(u64, Arc<ClusterTls>)> = REGISTERED
        .lock_or_recover()
        .iter()
        .filter(|e| e.key == key)
        .filter_map(|e| Some((e.material, e.tls.upgrade()?)))
        .collect();
    if candidates.is_empty() {
        return Found::Unknown;
    }
    if let Some(tls) = only_material(&candidates) {
        return Found::One(tls);
    }
    let Some(address) = address_of(info.addr()) else {
        return Found::Ambiguous;
    };
    let claiming: Vec<_> = candidates
        .into_iter()
        .filter(|(_, tls)| tls.claims(&address))
        .collect();
    only_material(&claiming).map_or(Found::Ambiguous, Found::One)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// A throwaway PKI made by `openssl` in `dir`: a CA, and a server certificate it signed for
    /// 127.0.0.1 and localhost. `(ca, server cert, server key)` as PEM.
    pub fn throwaway_pki(dir: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        // EC P-256, with the extensions webpki insists on (CA:TRUE + keyCertSign for the CA,
        // serverAuth and an IP SAN for the leaf).
        std::fs::write(
            dir.join("openssl.cnf"),
            "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = placeholder\n\
             [ca_ext]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign\n\
             [server_ext]\nbasicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\n\
             subjectAltName = IP:127.0.0.1, DNS:localhost\n",
        )
        .unwrap();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let cnf = ["-config", "openssl.cnf"];
        openssl(
            &[
                &["req", "-x509", "-new"][..],
                &key,
                &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"],
                &["-subj", "/CN=test CA"],
                &cnf,
                &["-extensions", "ca_ext"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-new"][..],
                &key,
                &["-keyout", "server.key", "-out", "server.csr"],
                &["-subj", "/CN=localhost"],
                &cnf,
            ]
            .concat(),
        );
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "7",
            "-days",
            "2",
            "-out",
            "server.crt",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            "server_ext",
        ]);
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        (read("ca.crt"), read("server.crt"), read("server.key"))
    }

    /// A temporary directory, removed when dropped.
    pub struct TempDir(pub std::path::PathBuf);

    impl TempDir {
        pub fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!(
                "sc-{name}-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A node's `ConnectionInfo` as the cluster client makes it from these options: the
    /// crate's own TLS parameters (`Client::build_with_tls` parses them as the cluster does).
    pub fn node_info(port: u16, options: &TlsOptions, password: Option<&str>) -> ConnectionInfo {
        let mut url = format!("rediss://127.0.0.1:{port}");
        if let Some(p) = password {
            url = format!("rediss://:{p}@127.0.0.1:{port}");
        }
        let info: ConnectionInfo = redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .unwrap()
            .set_addr(ConnectionAddr::TcpTls {
                host: "127.0.0.1".into(),
                port,
                insecure: !options.reject_unauthorized,
                tls_params: None,
            });
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: options.ca.clone(),
        };
        redis::Client::build_with_tls(info, certs)
            .unwrap()
            .get_connection_info()
            .clone()
    }

    fn ca_options(ca: Vec<u8>) -> TlsOptions {
        TlsOptions {
            ca: Some(ca),
            reject_unauthorized: true,
            ..Default::default()
        }
    }

    /// Two clusters with the same credentials but different CAs (which the crate's parameters
    /// do not show): each node is told apart by the address its cluster claims (its seeds, the
    /// nodes it learned), and one neither claims is ambiguous. Another password is no cluster's;
    /// a closed cluster's configuration is gone.
    #[test]
    fn clusters_with_the_same_credentials_but_other_cas_are_told_apart_by_address() {
        let (a, b) = (TempDir::new("pki-a"), TempDir::new("pki-b"));
        let (ca_a, ..) = throwaway_pki(&a.0);
        let (ca_b, ..) = throwaway_pki(&b.0);
        let (opts_a, opts_b) = (ca_options(ca_a), ca_options(ca_b));
        let node_a = node_info(1, &opts_a, Some("pw"));
        let node_b = node_info(2, &opts_b, Some("pw"));
        let tls_a = register(&node_a, std::slice::from_ref(&node_a), &opts_a, false);
        assert!(matches!(
            lookup(&node_info(3, &opts_a, Some("pw"))),
            Found::One(_)
        ));
        assert!(!tls_a.contested(), "alone under its key");
        let tls_b = register(&node_b, std::slice::from_ref(&node_b), &opts_b, false);
        assert!(tls_a.contested() && tls_b.contested());
        let is = |found: Found, tls: &Arc<ClusterTls>| matches!(found, Found::One(t) if Arc::ptr_eq(&t, tls));
        assert!(is(lookup(&node_a), &tls_a), "the first cluster's seed");
        assert!(is(lookup(&node_b), &tls_b), "the second cluster's seed");
        let unclaimed = node_info(3, &opts_a, Some("pw"));
        assert!(matches!(lookup(&unclaimed), Found::Ambiguous));
        tls_a.claim([("127.0.0.1".to_string(), 3)]);
        assert!(
            is(lookup(&unclaimed), &tls_a),
            "a node the first cluster learned"
        );
        assert!(matches!(
            lookup(&node_info(1, &opts_a, Some("other"))),
            Found::Unknown
        ));
        drop(tls_a);
        assert!(
            is(lookup(&node_a), &tls_b),
            "a closed cluster's configuration is gone: the other's is the only one"
        );
        drop(tls_b);
        assert!(matches!(lookup(&node_b), Found::Unknown));
    }

    /// Two live clusters with equal material share one key harmlessly; different material under
    /// one key, neither claiming the node, is ambiguous; dead entries are pruned at the next
    /// registration.
    #[test]
    fn equal_keys_are_shared_or_ambiguous_and_dead_entries_go() {
        let opts = |ca: &str| ca_options(ca.as_bytes().to_vec());
        let info = node_info(2, &TlsOptions::default(), Some("shared-key-test"));
        let first = register(&info, &[], &opts("x"), false);
        let same = register(&info, &[], &opts("x"), false);
        assert!(matches!(lookup(&info), Found::One(_)), "equal material");
        let other = register(&info, &[], &opts("y"), false);
        assert!(matches!(lookup(&info), Found::Ambiguous));
        drop(other);
        assert!(matches!(lookup(&info), Found::One(_)));
        drop((first, same));
        assert!(matches!(lookup(&info), Found::Unknown));
        let _kept = register(&info, &[], &opts("z"), false);
        let key = key_of(&info).unwrap();
        let entries = REGISTERED
            .lock_or_recover()
            .iter()
            .filter(|e| e.key == key)
            .count();
        assert_eq!(entries, 1, "the dead entries were pruned");
    }
}
