//! The Redis tier against a real redis-server started on a free loopback port for each test and
//! killed when the test ends (pass or fail), as redis-rs's own integration tests do.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stampede_cache::envelope::write_identity;
use stampede_cache::envelope::{Body, Envelope, Serializer};
use stampede_cache::inbox::{Inbox, Stamp};
use stampede_cache::stats::Stats;
use stampede_cache::store::redis::{
    Applied, Expected, Fetched, Gate, LockOutcome, Policies, RedisConfig, RedisTier, Replaying,
    WriteBack,
};

struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    /// A private redis-server on a free port. The port is found free and then released, so
    /// another test may start its server there first: the server that answers must be ours
    /// (its `process_id`), or a new port is tried.
    fn start() -> RedisServer {
        for _ in 0..10 {
            if let Some(server) = RedisServer::try_start() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    fn try_start() -> Option<RedisServer> {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // REDIS_SERVER=valkey-server runs these against Valkey.
        let server = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut child = Command::new(server)
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
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return None; // it could not listen there
            }
            if answering_pid(port) == Some(child.id()) {
                return Some(RedisServer {
                    child,
                    url: format!("redis://127.0.0.1:{port}"),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

/// The process id of the redis-server answering on `port`, if one answers.
fn answering_pid(port: u16) -> Option<u32> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&reply).contains("process_id:") || !reply.ends_with(b"\r\n") {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    let line = text.lines().find(|l| l.starts_with("process_id:"))?;
    line["process_id:".len()..].trim().parse().ok()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tier of namespace `t` whose locks live `lock_ttl_ms`, counting into stats of its own.
fn tier(url: &str, lock_ttl_ms: u64) -> (Arc<RedisTier>, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    (counted_tier(url, lock_ttl_ms, stats.clone()), stats)
}

/// A tier as `tier` makes, counting into `stats` (shared by tiers of one process).
fn counted_tier(url: &str, lock_ttl_ms: u64, stats: Arc<Stats>) -> Arc<RedisTier> {
    let policies = Policies {
        namespace: "t".to_string(),
        serializer: Serializer::Json,
        lock_ttl_ms,
        tag_ttl_ms: stampede_cache::policy::MAX_HARD_TTL_MS as u64,
    };
    let tier = RedisTier::new(
        &RedisConfig::from_url(url),
        policies,
        stats,
        Arc::new(Inbox::default()),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    tokio::spawn(tier.clone().run_bus());
    tier
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64
}

async fn get(c: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(c).await.unwrap()
}

/// The namespace clock of the tiers' namespace (`t`), as Redis holds it.
async fn namespace_clock(c: &mut redis::aio::MultiplexedConnection) -> String {
    redis::cmd("HGET")
        .arg("t:meta")
        .arg("clock")
        .query_async(c)
        .await
        .unwrap()
}

/// The bytes Redis holds at `key`.
async fn bytes_in(c: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query_async(c).await.unwrap()
}

/// The value the entry at `key` holds, as its JSON (a marker, or no key: `None`).
async fn value_in(c: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(c).await.unwrap();
    let bytes = bytes?;
    let d = Envelope::decode(&bytes)?;
    d.value_json.map(std::borrow::Cow::into_owned)
}

/// What `write` answers for a set or delete applied.
fn wrote(existed: bool) -> Applied {
    Applied::Wrote { existed }
}

/// A replay, made at `made_at`, of a change made knowing nothing of the key.
fn unknown(made_at: u64) -> Option<Replaying> {
    Some(Replaying {
        made_at,
        expected: Expected::Unknown,
    })
}

/// A replay, made at `made_at`, of a change made while holding `held`, written at `key`.
fn known(made_at: u64, held: &Envelope, key: &str) -> Option<Replaying> {
    Some(Replaying {
        made_at,
        expected: Expected::Known(write_identity(held, &format!("t:v:{{{key}}}"))),
    })
}

fn envelope(ttl: f64) -> Envelope {
    Envelope::new(now_ms(), ttl, ttl * 10.0, 5.0, false)
}

/// Polls until `t` has a lock waiter registered: the event a test waits for before the holder
/// writes, so the waiter is proven to wait (a fixed sleep loses that race on a loaded machine).
async fn until_waiting(t: &RedisTier) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.waiting_keys() == 0 {
        assert!(
            Instant::now() < deadline,
            "no lock waiter registered within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The write-back of a forced load (`force_gate`'s `gate`) of `key`.
async fn forced_write_back(t: &RedisTier, key: &str, gate: &Gate) -> WriteBack {
    let Gate::Lead { fence, .. } = gate else {
        panic!("{gate:?}")
    };
    let written = envelope(60_000.0);
    let body = Body::json(Some("\"old\""));
    t.write_back(key, Some((&written, &body)), None, fence.as_ref(), true)
        .await
}

/// A cold gate that must lead: (token, gate) for `write_back`.
async fn lead(t: &RedisTier, key: &str) -> Gate {
    let gate = t.cold_gate(key, false).await;
    assert!(
        matches!(gate, Gate::Lead { .. }),
        "expected to lead: {gate:?}"
    );
    gate
}

async fn write_back(t: &RedisTier, key: &str, gate: &Gate, value: &str) -> WriteBack {
    let Gate::Lead { token, fence, .. } = gate else {
        panic!("{gate:?}")
    };
    t.write_back(
        key,
        Some((&envelope(60_000.0), &Body::json(Some(value)))),
        token.as_deref(),
        fence.as_ref(),
        false,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_deletes_only_its_own_token() {
    let server = RedisServer::start();
    let (t, _) = tier(&server.url, 60_000);
    let mut c = server.conn().await;
    let Gate::Lead {
        token: Some(mine), ..
    } = lead(&t, "k").await
    else {
        panic!("the first caller takes the lock")
    };
    t.release("k", "theirs", false).await;
    assert_eq!(
        get(&mut c, "t:lock:{k}").await.as_deref(),
        Some(mine.as_str())
    );
    t.release("k", &mine, false).await;
    assert_eq!(get(&mut c, "t:lock:{k}").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_the_waiter_gets_its_value_from_the_bus() {
    let server = RedisServer::start();
    let (a, a_stats) = tier(&server.url, 10_000);
    let (b, b_stats) = tier(&server.url, 10_000);
    let gate = lead(&a, "k").await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (b.cold_gate("k", false).await, started.elapsed())
        })
    };
    until_waiting(&b).await;
    assert_eq!(
        write_back(&a, "k", &gate, r#"{"v":1}"#).await,
        WriteBack::Written
    );
    let (found, waited) = waiter.await.unwrap();
    match found {
        Gate::Found(r) => assert_eq!(r.value_json.as_deref(), Some(r#"{"v":1}"#)),
        other => panic!("the waiter must get the leader's value, got {other:?}"),
    }
    // Woken by the announcement, not by the 10 s lock expiry.
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(a_stats.snapshot().lock_wins, 1);
    assert_eq!(b_stats.snapshot().lock_waits, 1);
    assert_eq!(b.waiting_keys(), 0);
    let mut c = server.conn().await;
    assert_eq!(
        get(&mut c, "t:lock:{k}").await,
        None,
        "the write released the lock"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("t:v:{k}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(pttl > 500_000 && pttl <= 600_000, "{pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_that_began_before_a_set_or_delete_is_dropped() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    // delete: the key stays gone.
    let gate = lead(&a, "d").await;
    assert_eq!(
        b.write("d", None, now_ms() as u64, None).await,
        Ok(wrote(false))
    );
    assert_eq!(
        write_back(&a, "d", &gate, "\"old\"").await,
        WriteBack::Dropped
    );
    assert_eq!(value_in(&mut c, "t:v:{d}").await, None);
    assert_eq!(
        get(&mut c, "t:lock:{d}").await,
        None,
        "the lock was released anyway"
    );
    // set: the newer value stays.
    let gate = lead(&a, "s").await;
    let newer = envelope(60_000.0);
    assert_eq!(
        b.write(
            "s",
            Some((&newer, &Body::json(Some("\"new\"")))),
            now_ms() as u64,
            None
        )
        .await,
        Ok(wrote(false))
    );
    assert_eq!(
        write_back(&a, "s", &gate, "\"old\"").await,
        WriteBack::Dropped
    );
    assert_eq!(
        value_in(&mut c, "t:v:{s}").await.as_deref(),
        Some("\"new\"")
    );
    // A load that began after them is written.
    let gate = lead(&a, "d").await;
    assert_eq!(
        write_back(&a, "d", &gate, "\"after\"").await,
        WriteBack::Written
    );
}

/// A load's result written over a value is announced carrying the envelope Redis now holds,
/// byte for byte: `write_back.lua` appends what it wrote to the prefix it is given, and what it
/// wrote carries the time of the key's last set over (a header the caller did not send).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_announces_the_very_envelope_redis_holds() {
    use futures_util::StreamExt;
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let set = envelope(60_000.0);
    assert_eq!(
        b.write(
            "k",
            Some((&set, &Body::json(Some("\"set\"")))),
            now_ms() as u64,
            None
        )
        .await,
        Ok(wrote(false))
    );
    let mut pubsub = redis::Client::open(server.url.as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe("t:bus:0").await.unwrap();
    // A load over the value (found unusable), written over it: announced.
    let gate = a.cold_gate("k", true).await;
    assert!(matches!(gate, Gate::Lead { .. }), "{gate:?}");
    assert_eq!(
        write_back(&a, "k", &gate, "\"loaded\"").await,
        WriteBack::Written
    );
    let message = tokio::time::timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await
        .expect("announced")
        .expect("a message");
    let payload: Vec<u8> = message.get_payload().unwrap();
    assert_eq!(payload[0], 0xFE, "a carried announcement");
    // 0xFE, the origin, ' ', the key's length, ' ', the key, then the envelope.
    let mut rest = &payload[1..];
    for _ in 0..2 {
        let space = rest.iter().position(|&b| b == b' ').unwrap();
        rest = &rest[space + 1..];
    }
    let envelope = rest.strip_prefix(b"k").expect("the key");
    let held = bytes_in(&mut c, "t:v:{k}").await.unwrap();
    assert_eq!(
        envelope,
        &held[..],
        "the envelope announced is the one Redis holds"
    );
    assert_eq!(
        held[0], 0xC6,
        "timed: the set's time carried over by the script"
    );
    assert_eq!(
        value_in(&mut c, "t:v:{k}").await.as_deref(),
        Some("\"loaded\"")
    );
}

/// A replayed set or delete (one Redis could not take when it was made) is dropped when the key
/// holds a change made at or after it, by any instance: a set's envelope, or a load's result
/// written over one; one made after the key's latest change applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_change_never_replaces_a_newer_one() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let made = now_ms() as u64;
    let e = envelope(60_000.0);
    let live = Body::json(Some("\"b live\""));
    assert_eq!(
        b.write("r", Some((&e, &live)), made + 10, None).await,
        Ok(wrote(false))
    );
    let older = Body::json(Some("\"a older\""));
    assert_eq!(
        a.write("r", Some((&e, &older)), made, unknown(made)).await,
        Ok(Applied::Superseded),
        "an older replayed set is dropped"
    );
    assert_eq!(
        a.write("r", None, made + 5, unknown(made + 5)).await,
        Ok(Applied::Superseded)
    );
    assert_eq!(
        value_in(&mut c, "t:v:{r}").await.as_deref(),
        Some("\"b live\"")
    );
    let newer = Body::json(Some("\"a newer\""));
    assert_eq!(
        a.write(
            "r",
            Some((&e, &newer)),
            made + 20,
            known(made + 20, &e, "r")
        )
        .await,
        Ok(wrote(true)),
        "a newer replayed set over the write it held applies"
    );
    assert_eq!(
        value_in(&mut c, "t:v:{r}").await.as_deref(),
        Some("\"a newer\"")
    );
    assert_eq!(
        a.write("r", None, made + 30, unknown(made + 30)).await,
        Ok(wrote(true))
    );
    assert_eq!(
        value_in(&mut c, "t:v:{r}").await,
        None,
        "and so does a newer delete"
    );
    // A load's result written over a set keeps the set's time: a replayed set older than that
    // set is still dropped, one newer applies.
    assert_eq!(
        b.write("w", Some((&e, &live)), made + 40, None).await,
        Ok(wrote(false))
    );
    let gate = b.cold_gate("w", true).await;
    assert!(matches!(gate, Gate::Lead { .. }), "{gate:?}");
    assert_eq!(
        write_back(&b, "w", &gate, "\"loaded\"").await,
        WriteBack::Written
    );
    assert_eq!(
        a.write("w", Some((&e, &older)), made + 35, unknown(made + 35))
            .await,
        Ok(Applied::Superseded),
        "a replayed set older than the set the load followed"
    );
    assert_eq!(
        a.write("w", None, made + 39, unknown(made + 39)).await,
        Ok(Applied::Superseded)
    );
    assert_eq!(
        value_in(&mut c, "t:v:{w}").await.as_deref(),
        Some("\"loaded\"")
    );
    assert_eq!(
        a.write("w", None, made + 41, unknown(made + 41)).await,
        Ok(wrote(true))
    );
    // Two changes of this instance in one millisecond are two: the second is the newer.
    let first = a.change_time(made + 100);
    let second = a.change_time(made + 100);
    assert!(second > first);
    let one = Body::json(Some("1"));
    let two = Body::json(Some("2"));
    assert_eq!(
        a.write("r", Some((&e, &one)), first, unknown(first)).await,
        Ok(wrote(false)),
        "r was deleted"
    );
    assert_eq!(
        a.write("r", Some((&e, &two)), second, known(second, &e, "r"))
            .await,
        Ok(wrote(true))
    );
    assert_eq!(value_in(&mut c, "t:v:{r}").await.as_deref(), Some("2"));
    // A key never written: a replayed set applies. One filled by a load this instance did not
    // see: it is deleted instead (the load may be newer than the set; see the next test).
    assert_eq!(
        a.write("fresh", Some((&e, &newer)), made, unknown(made))
            .await,
        Ok(wrote(false))
    );
    let gate = lead(&b, "filled").await;
    assert_eq!(
        write_back(&b, "filled", &gate, "\"loaded\"").await,
        WriteBack::Written
    );
    assert_eq!(
        a.write("filled", Some((&e, &newer)), made, unknown(made))
            .await,
        Ok(Applied::Invalidated)
    );
    assert_eq!(value_in(&mut c, "t:v:{filled}").await, None);
}

/// A replayed set applies only over what its instance knew of the key when it made it (issue
/// 37): the very write it held, nothing after its own delete, nothing known and no key, or
/// what its own clear left. Anything else (another write, a marker, an earlier version's JSON
/// envelope of the same times) is not provably that: the key is deleted instead. A replayed
/// delete applies whatever it finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_set_over_a_key_changed_unseen_deletes_it_instead() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let made = now_ms() as u64;
    let held = envelope(60_000.0);
    let other = envelope(30_000.0);
    let v = Body::json(Some("\"a\""));
    let replay = |expected| {
        Some(Replaying {
            made_at: made + 10,
            expected,
        })
    };
    // Another write than the one held.
    b.write("k", Some((&other, &v)), made, None).await.unwrap();
    assert_eq!(
        a.write(
            "k",
            Some((&held, &v)),
            made + 10,
            known(made + 10, &held, "k")
        )
        .await,
        Ok(Applied::Invalidated)
    );
    assert_eq!(value_in(&mut c, "t:v:{k}").await, None);
    // Nothing expected after its own delete, but a write there.
    b.write("k", Some((&other, &v)), made, None).await.unwrap();
    assert_eq!(
        a.write("k", Some((&held, &v)), made + 10, replay(Expected::Absent))
            .await,
        Ok(Applied::Invalidated)
    );
    // Nothing expected and nothing there: applied.
    assert_eq!(
        a.write("k", Some((&held, &v)), made + 10, replay(Expected::Absent))
            .await,
        Ok(wrote(false))
    );
    // A marker: a load running elsewhere on a key with no value. Deleted, its load dropped.
    let gate = lead(&b, "m").await;
    assert_eq!(
        a.write("m", Some((&held, &v)), made + 10, replay(Expected::Unknown))
            .await,
        Ok(Applied::Invalidated)
    );
    assert_eq!(bytes_in(&mut c, "t:v:{m}").await, None);
    assert_eq!(
        write_back(&b, "m", &gate, "\"loaded\"").await,
        WriteBack::Dropped
    );
    // An earlier version's JSON envelope with the very times held: not provably that write.
    let json = format!(
        r#"{{"sc":1,"gen":"g0","born":{},"freshUntil":{},"hardUntil":{},"computeMs":{},"retryAfter":0,"value":"v"}}"#,
        held.born, held.fresh_until, held.hard_until, held.compute_ms
    );
    let _: () = redis::cmd("SET")
        .arg("t:v:{j}")
        .arg(&json)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        a.write(
            "j",
            Some((&held, &v)),
            made + 10,
            known(made + 10, &held, "j")
        )
        .await,
        Ok(Applied::Invalidated)
    );
    // A replayed delete applies over anything.
    b.write("d", Some((&other, &v)), made, None).await.unwrap();
    assert_eq!(
        a.write("d", None, made + 10, replay(Expected::Absent))
            .await,
        Ok(wrote(true))
    );
    // Behind its own clear: an entry born before the clear is what it left.
    b.write("c", Some((&other, &v)), made, None).await.unwrap();
    a.clear(&Default::default()).await.unwrap();
    assert_eq!(
        a.write("c", Some((&held, &v)), made + 10, replay(Expected::Cleared))
            .await,
        Ok(wrote(true))
    );
    assert_eq!(value_in(&mut c, "t:v:{c}").await.as_deref(), Some("\"a\""));
    // One born since (written after the clear, unseen) is not.
    assert_eq!(
        a.write(
            "c",
            Some((&held, &v)),
            made + 20,
            Some(Replaying {
                made_at: made + 20,
                expected: Expected::Cleared
            })
        )
        .await,
        Ok(Applied::Invalidated)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_result_is_never_overwritten_by_the_expired_holder() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 200);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let first = lead(&a, "k").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let takeover = lead(&b, "k").await;
    assert_eq!(
        write_back(&b, "k", &takeover, "\"B\"").await,
        WriteBack::Written
    );
    // B released its lock: only the fence can tell that A's result is older.
    assert_eq!(get(&mut c, "t:lock:{k}").await, None);
    assert_eq!(
        write_back(&a, "k", &first, "\"A\"").await,
        WriteBack::Dropped
    );
    assert_eq!(value_in(&mut c, "t:v:{k}").await.as_deref(), Some("\"B\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_without_an_expiry_is_given_one() {
    let server = RedisServer::start();
    let (t, _) = tier(&server.url, 300);
    let mut c = server.conn().await;
    let _: () = redis::cmd("SET")
        .arg("t:lock:{k}")
        .arg("stray")
        .query_async(&mut c)
        .await
        .unwrap();
    let started = Instant::now();
    let gate = t.cold_gate("k", false).await;
    assert!(
        matches!(gate, Gate::Lead { token: Some(_), .. }),
        "{gate:?}"
    );
    // Taken over once the expiry it was given ran out, not waited on forever.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_is_skipped_while_another_holds_the_lock_and_backs_off_after_a_failure() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let stale = Envelope::new(now_ms() - 10_000.0, 1_000.0, 60_000.0, 5.0, false);
    assert_eq!(
        a.write(
            "k",
            Some((&stale, &Body::json(Some("1")))),
            now_ms() as u64,
            None
        )
        .await,
        Ok(wrote(false))
    );

    let Gate::Lead {
        token: Some(token), ..
    } = a.refresh_gate("k", stale.fresh_until).await
    else {
        panic!("the first refresher leads")
    };
    assert_eq!(b.refresh_gate("k", stale.fresh_until).await, Gate::Skip);

    let retry_after = now_ms() + 30_000.0;
    a.record_failure("k", Some(&token), retry_after).await;
    match b.refresh_gate("k", stale.fresh_until).await {
        Gate::Found(r) => assert_eq!(r.envelope.retry_after, retry_after),
        other => panic!("the recorded backoff must hold the refresh back, got {other:?}"),
    }
    match b.fetch("k", Stamp(0), false).await {
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
    let (t, stats) = tier(&format!("redis://127.0.0.1:{port}"), 1_000);
    let started = Instant::now();
    assert_eq!(t.fetch("k", Stamp(0), false).await, Fetched::Unavailable);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the connect timeout"
    );
    let again = Instant::now();
    for _ in 0..100 {
        assert!(matches!(
            t.cold_gate("k", false).await,
            Gate::Lead {
                token: None,
                fence: None,
                ..
            }
        ));
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
async fn close_drops_the_bus_and_the_command_connection_with_the_tier() {
    let server = RedisServer::start();
    let mut admin = server.conn().await;
    let baseline = connected_clients(&mut admin).await;
    let (t, _) = tier(&server.url, 10_000);
    assert_eq!(t.fetch("k", Stamp(0), false).await, Fetched::Missing);
    let deadline = Instant::now() + Duration::from_secs(5);
    while connected_clients(&mut admin).await < baseline + 2 {
        assert!(
            Instant::now() < deadline,
            "bus and command connections never both opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.close();
    assert_eq!(
        t.fetch("k", Stamp(0), false).await,
        Fetched::Unavailable,
        "closed: no more commands"
    );
    drop(t);
    let deadline = Instant::now() + Duration::from_secs(5);
    while connected_clients(&mut admin).await > baseline {
        assert!(
            Instant::now() < deadline,
            "connections left open after close"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bid_for_the_lock_says_how_it_ended() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    // One process's bids, each under the lockTtl its case needs, counted together.
    let b_stats = Arc::new(Stats::default());
    let b = |lock_ttl_ms| counted_tier(&server.url, lock_ttl_ms, b_stats.clone());
    let mut c = server.conn().await;
    let set_lock = |key: &str, px: u64| {
        redis::cmd("SET")
            .arg(format!("t:lock:{{{key}}}"))
            .arg("someone-else")
            .arg("PX")
            .arg(px)
            .clone()
    };

    // A free lock: won at the first look.
    let (gate, outcome) = b(1_000).cold_gate_observed("free", false, false).await;
    assert!(
        matches!(gate, Gate::Lead { token: Some(_), .. }),
        "{gate:?}"
    );
    assert_eq!(outcome, LockOutcome::Won);

    // Held by a process that writes its value: waited, then found it.
    let held = lead(&a, "filled").await;
    let filling = b(10_000);
    let waiter = {
        let b = filling.clone();
        tokio::spawn(async move { b.cold_gate_observed("filled", false, false).await })
    };
    until_waiting(&filling).await;
    assert_eq!(
        write_back(&a, "filled", &held, "1").await,
        WriteBack::Written
    );
    let (gate, outcome) = waiter.await.unwrap();
    assert!(matches!(gate, Gate::Found(_)), "{gate:?}");
    assert_eq!(outcome, LockOutcome::Waited);

    // Held by a holder that vanishes (its lock expires): waited, then took it over.
    let _: () = set_lock("expiring", 150).query_async(&mut c).await.unwrap();
    let (gate, outcome) = b(5_000).cold_gate_observed("expiring", false, false).await;
    assert!(
        matches!(gate, Gate::Lead { token: Some(_), .. }),
        "{gate:?}"
    );
    assert_eq!(outcome, LockOutcome::TookOver);

    // Held past two lockTtls: waited, then gave up and loads without the lock (fenced).
    let _: () = set_lock("stuck", 60_000).query_async(&mut c).await.unwrap();
    let (gate, outcome) = b(150).cold_gate_observed("stuck", false, false).await;
    assert!(
        matches!(
            gate,
            Gate::Lead {
                token: None,
                fence: Some(_),
                ..
            }
        ),
        "{gate:?}"
    );
    assert_eq!(outcome, LockOutcome::GaveUp);

    // The counters agree: won and took over are wins; every bid that waited is one wait.
    let s = b_stats.snapshot();
    assert_eq!((s.lock_wins, s.lock_waits), (2, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_ends_an_entry_s_freshness_keeps_its_value_and_expiry_and_fences_older_loads() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let written = envelope(60_000.0);
    assert_eq!(
        a.write(
            "k",
            Some((&written, &Body::json(Some("\"v\"")))),
            now_ms() as u64,
            None
        )
        .await,
        Ok(wrote(false))
    );
    let pttl_before: i64 = redis::cmd("PTTL")
        .arg("t:v:{k}")
        .query_async(&mut c)
        .await
        .unwrap();
    let before = bytes_in(&mut c, "t:v:{k}").await.unwrap();
    let before = Envelope::decode(&before).unwrap().generation.to_vec();
    // A forced load of the key begins (its fence is read now: it compares only the set part of
    // the generation), then the key is expired elsewhere.
    let gate = a.force_gate("k").await;
    let now = now_ms().floor();
    assert_eq!(b.expire("k", now).await, Ok(true));
    let bytes = bytes_in(&mut c, "t:v:{k}").await.unwrap();
    let d = Envelope::decode(&bytes).expect("still an envelope this reads");
    assert_eq!(d.envelope.fresh_until, now, "stale from now");
    assert_eq!(d.envelope.hard_until, written.hard_until, "its expiry kept");
    assert_eq!(d.envelope.born, written.born, "its birth kept");
    assert_ne!(d.generation[..4], before[..4], "a new set part");
    assert_eq!(value_in(&mut c, "t:v:{k}").await.as_deref(), Some("\"v\""));
    let pttl: i64 = redis::cmd("PTTL")
        .arg("t:v:{k}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        pttl > 0 && pttl <= pttl_before,
        "its Redis expiry kept: {pttl}"
    );
    // The load that began before the expire is not written over it.
    assert_eq!(forced_write_back(&a, "k", &gate).await, WriteBack::Dropped);
    // A second expire changes nothing but the fence; a missing key answers false.
    assert_eq!(b.expire("k", now + 5.0).await, Ok(true));
    let again = bytes_in(&mut c, "t:v:{k}").await.unwrap();
    let again = Envelope::decode(&again).unwrap();
    assert_eq!(again.envelope.fresh_until, now);
    assert_ne!(again.generation, d.generation, "the fence moved again");
    assert_eq!(b.expire("none", now).await, Ok(false));
    assert_eq!(bytes_in(&mut c, "t:v:{none}").await, None, "nothing made");
    // A not-found has no value to serve stale: it goes.
    let negative = Envelope::new(now_ms(), 60_000.0, 60_000.0, 1.0, true);
    b.write(
        "n",
        Some((&negative, &Body::json(None))),
        now_ms() as u64,
        None,
    )
    .await
    .unwrap();
    assert!(bytes_in(&mut c, "t:v:{n}").await.is_some());
    assert_eq!(b.expire("n", now).await, Ok(true));
    assert_eq!(bytes_in(&mut c, "t:v:{n}").await, None);
    // Something this library did not write is left as it is.
    let _: () = redis::cmd("SET")
        .arg("t:v:{foreign}")
        .arg("{\"x\":1}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(b.expire("foreign", now).await, Ok(true));
    assert_eq!(
        get(&mut c, "t:v:{foreign}").await.as_deref(),
        Some("{\"x\":1}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_drops_the_marker_of_a_load_on_a_key_with_no_value_as_a_delete_does() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let (b, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let gate = lead(&a, "m").await;
    assert!(bytes_in(&mut c, "t:v:{m}").await.is_some(), "its marker");
    assert_eq!(b.expire("m", now_ms()).await, Ok(false), "no value held");
    assert_eq!(bytes_in(&mut c, "t:v:{m}").await, None, "the marker gone");
    assert_eq!(
        write_back(&a, "m", &gate, "\"late\"").await,
        WriteBack::Dropped
    );
    assert_eq!(bytes_in(&mut c, "t:v:{m}").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_of_an_old_json_envelope_keeps_it_json_stale_and_fences_loads_of_either_release() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let now = now_ms().floor();
    let old_gen = "0123456789abcdef0123456789abcdef";
    let json = format!(
        r#"{{"sc":1,"gen":"{old_gen}","born":0,"freshUntil":{},"hardUntil":{},"computeMs":5,"retryAfter":0,"value":"v"}}"#,
        now + 60_000.0,
        now + 120_000.0
    );
    let _: () = redis::cmd("SET")
        .arg("t:v:{j}")
        .arg(&json)
        .arg("PX")
        .arg(120_000)
        .query_async(&mut c)
        .await
        .unwrap();
    // The previous release's fence (its generation key), beside the envelope it wrote.
    let _: () = redis::cmd("SET")
        .arg("t:gen:{j}")
        .arg("prev")
        .query_async(&mut c)
        .await
        .unwrap();
    let gate = a.force_gate("j").await;
    assert_eq!(a.expire("j", now).await, Ok(true));
    let text = get(&mut c, "t:v:{j}").await.expect("kept");
    assert!(text.starts_with(r#"{"sc":1,"gen":""#), "still JSON: {text}");
    let d = Envelope::decode(text.as_bytes()).expect("readable");
    assert_eq!(d.envelope.fresh_until, now, "stale from now");
    assert_eq!(d.envelope.hard_until, now + 120_000.0, "its expiry kept");
    assert_ne!(d.generation[..4], old_gen.as_bytes()[..4], "a new set part");
    assert!(d.generation.iter().all(u8::is_ascii_alphanumeric));
    assert_eq!(value_in(&mut c, "t:v:{j}").await.as_deref(), Some("\"v\""));
    assert_eq!(get(&mut c, "t:gen:{j}").await, None, "the old fence gone");
    assert_eq!(forced_write_back(&a, "j", &gate).await, WriteBack::Dropped);
    // An old not-found goes.
    let negative = format!(
        r#"{{"sc":1,"gen":"{old_gen}","born":0,"freshUntil":{},"hardUntil":{},"computeMs":5,"retryAfter":0,"negative":true,"value":null}}"#,
        now + 60_000.0,
        now + 120_000.0
    );
    let _: () = redis::cmd("SET")
        .arg("t:v:{jn}")
        .arg(&negative)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(a.expire("jn", now).await, Ok(true));
    assert_eq!(get(&mut c, "t:v:{jn}").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_list_of_any_length_is_recorded_at_one_clock_by_one_script() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let tags: Vec<String> = (0..300).map(|i| format!("tag{i}")).collect();
    for stale in [false, true] {
        a.mark_tags(&tags, stale.then_some(f64::INFINITY))
            .await
            .unwrap();
        let clock = namespace_clock(&mut c).await;
        let kind = if stale { "stale" } else { "tag" };
        for tag in &tags {
            assert_eq!(
                get(&mut c, &format!("t:{kind}:{{{tag}}}")).await.as_deref(),
                Some(clock.as_str()),
                "{kind} {tag}"
            );
        }
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("t:{kind}:{{tag299}}"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(pttl > 0, "the records expire");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expire_by_tag_window_is_recorded_and_once_over_folded_into_a_deletion() {
    let server = RedisServer::start();
    let (a, _) = tier(&server.url, 10_000);
    let mut c = server.conn().await;
    let tags = vec!["w".to_string()];
    let until = now_ms().floor() + 300.0;
    a.mark_tags(&tags, Some(until)).await.unwrap();
    let first = namespace_clock(&mut c).await;
    assert_eq!(
        get(&mut c, "t:stale:{w}").await,
        Some(format!("{first} {}", until as u64)),
        "the clock and the window's end"
    );
    assert_eq!(get(&mut c, "t:tag:{w}").await, None, "nothing dead yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.mark_tags(&tags, Some(f64::INFINITY)).await.unwrap();
    let second = namespace_clock(&mut c).await;
    assert_eq!(
        get(&mut c, "t:stale:{w}").await,
        Some(second),
        "a new window: none"
    );
    assert_eq!(
        get(&mut c, "t:tag:{w}").await,
        Some(first),
        "the window that was over: what it made stale is dead"
    );
}
