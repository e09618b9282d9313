//! The Redis tier against a real redis-server started on a free loopback port for each test and
//! killed when the test ends (pass or fail), as redis-rs's own integration tests do.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stampede_cache::envelope::Envelope;
use stampede_cache::inbox::Inbox;
use stampede_cache::lock;
use stampede_cache::stats::Stats;
use stampede_cache::store::redis::{Fetched, Gate, RedisTier};

struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tier(url: &str) -> (Arc<RedisTier>, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    let tier = RedisTier::new(url, "t", stats.clone(), Arc::new(Inbox::default())).unwrap();
    tokio::spawn(tier.clone().run_bus());
    (tier, stats)
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_deletes_only_its_own_token() {
    let server = RedisServer::start();
    let mut c = server.conn().await;
    let script = redis::Script::new(lock::RELEASE_LUA);
    assert!(lock::acquire(&mut c, "t:lock:{k}", "mine", 60_000)
        .await
        .unwrap());
    assert!(!lock::acquire(&mut c, "t:lock:{k}", "theirs", 60_000)
        .await
        .unwrap());
    assert!(
        !lock::release(&mut c, &script, "t:lock:{k}", "theirs", None)
            .await
            .unwrap()
    );
    let holder: Option<String> = redis::cmd("GET")
        .arg("t:lock:{k}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(holder.as_deref(), Some("mine"));
    assert!(lock::release(&mut c, &script, "t:lock:{k}", "mine", None)
        .await
        .unwrap());
    assert_eq!(
        lock::remaining_ms(&mut c, "t:lock:{k}").await.unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_the_waiter_gets_its_value_from_the_bus() {
    let server = RedisServer::start();
    let (a, a_stats) = tier(&server.url);
    let (b, b_stats) = tier(&server.url);
    let Gate::Lead(Some(token)) = a.cold_gate("k", 10_000).await else {
        panic!("the first process leads with the lock")
    };
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (b.cold_gate("k", 10_000).await, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let envelope = Envelope::new(now_ms(), 5_000.0, 50_000.0, 200.0, false);
    assert!(
        a.store("k", &envelope, Some(r#"{"v":1}"#), Some(&token))
            .await
    );
    let (gate, waited) = waiter.await.unwrap();
    match gate {
        Gate::Found(r) => {
            assert_eq!(r.value_json.as_deref(), Some(r#"{"v":1}"#));
            assert_eq!(r.envelope, envelope);
        }
        other => panic!("the waiter must get the leader's value, got {other:?}"),
    }
    // Woken by the announcement, not by the 10 s lock expiry.
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(a_stats.snapshot().lock_wins, 1);
    assert_eq!(b_stats.snapshot().lock_waits, 1);
    assert_eq!(b.waiting_keys(), 0);
    let mut c = server.conn().await;
    assert_eq!(
        lock::remaining_ms(&mut c, "t:lock:{k}").await.unwrap(),
        None,
        "store released the lock"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("t:v:{k}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(pttl > 40_000 && pttl <= 50_000, "{pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_is_skipped_while_another_holds_the_lock_and_backs_off_after_a_failure() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url);
    let (b, _) = tier(&server.url);
    let stale = Envelope::new(now_ms() - 10_000.0, 1_000.0, 60_000.0, 5.0, false);
    assert!(a.store("k", &stale, Some("1"), None).await);

    let Gate::Lead(Some(token)) = a.refresh_gate("k", 10_000, stale.fresh_until).await else {
        panic!("the first refresher leads")
    };
    assert_eq!(
        b.refresh_gate("k", 10_000, stale.fresh_until).await,
        Gate::Skip
    );

    let retry_after = now_ms() + 30_000.0;
    a.record_failure("k", Some(&token), retry_after).await;
    match b.refresh_gate("k", 10_000, stale.fresh_until).await {
        Gate::Found(r) => assert_eq!(r.envelope.retry_after, retry_after),
        other => panic!("the recorded backoff must hold the refresh back, got {other:?}"),
    }
    match b.fetch("k").await {
        Fetched::Found(r) => {
            assert_eq!(r.value_json.as_deref(), Some("1"), "the stale value stays")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_degrades_at_once_after_the_first_failure() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (t, stats) = tier(&format!("redis://127.0.0.1:{port}"));
    let started = Instant::now();
    assert_eq!(t.fetch("k").await, Fetched::Unavailable);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the connect timeout"
    );
    let again = Instant::now();
    for _ in 0..100 {
        assert_eq!(t.cold_gate("k", 1_000).await, Gate::Lead(None));
    }
    assert!(
        again.elapsed() < Duration::from_millis(500),
        "skipped, not retried: {:?}",
        again.elapsed()
    );
    assert!(stats.snapshot().redis_errors >= 1);
    assert!(!t.take_reports().is_empty());
}

async fn connected_clients(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_drops_the_bus_and_the_command_connection() {
    let server = RedisServer::start();
    let mut admin = server.conn().await;
    let baseline = connected_clients(&mut admin).await;
    let (t, _) = tier(&server.url);
    assert_eq!(t.fetch("k").await, Fetched::Missing);
    let deadline = Instant::now() + Duration::from_secs(5);
    while connected_clients(&mut admin).await < baseline + 2 {
        assert!(
            Instant::now() < deadline,
            "bus and command connections never both opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.close();
    let deadline = Instant::now() + Duration::from_secs(5);
    while connected_clients(&mut admin).await > baseline {
        assert!(
            Instant::now() < deadline,
            "connections left open after close"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        t.fetch("k").await,
        Fetched::Unavailable,
        "closed: no more commands"
    );
}
