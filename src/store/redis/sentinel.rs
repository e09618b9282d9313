//! Following a Sentinel master across failovers. A failover that leaves the old master up
//! (`SENTINEL FAILOVER`, an operator's switch, a partition that heals) leaves it writable for
//! seconds, until a sentinel demotes it; what it accepts then is lost when it resyncs from the
//! new master. So the tier does not wait for its connections to break: it listens to every
//! sentinel's announcements of a promoted replica and of a switch of master and, while it hears none of them (no subscription
//! up), asks the sentinels where the master is every `POLL_PERIOD`. Either way the newest
//! config epoch among the sentinels that answer decides (`Topology::ask_master`); on a move, the
//! command connection and the read lane are dropped (`Link::master_moved`) and the bus
//! resubscribes (it watches `Topology::moves`). The task ends when the cache closes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, SelectAll, StreamExt};

use super::topology::{announced_master, Address};
use super::{until_true, RedisTier};

/// How often the sentinels are asked while no announcement can be heard, and retried.
pub const POLL_PERIOD: Duration = Duration::from_secs(1);
/// How often a sentinel whose subscription is down is retried while another one's is up.
const RESUBSCRIBE_PERIOD: Duration = Duration::from_secs(10);

/// One sentinel's announcements (channel, payload), by its index; `None` once its connection
/// ended.
type Announcements =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = (usize, Option<(String, String)>)> + Send>>;

impl RedisTier {
    /// Runs until the cache closes (spawned by `connect` under Sentinel).
    pub(super) async fn follow_master(self: Arc<Self>) {
        let topology = &self.link.topology;
        let count = topology.sentinel_count();
        let name = topology.master_name().unwrap_or_default().to_string();
        let mut shutdown = self.shutdown.subscribe();
        let mut streams: SelectAll<Announcements> = SelectAll::new();
        let mut up = vec![false; count];
        let mut retry_at = Instant::now();
        while !self.closed() {
            if up.contains(&false) && Instant::now() >= retry_at {
                let down: Vec<usize> = (0..count).filter(|i| !up[*i]).collect();
                let subscribing = futures_util::future::join_all(
                    down.iter().map(|i| topology.failover_announcements(*i)),
                );
                let made = tokio::select! {
                    _ = until_true(&mut shutdown) => return,
                    made = subscribing => made,
                };
                let mut any = false;
                for (index, made) in down.into_iter().zip(made) {
                    match made {
                        Ok(messages) => {
                            up[index] = true;
                            any = true;
                            let payloads = messages
                                .map(move |m| {
                                    let said = m.get_payload::<String>().unwrap_or_default();
                                    (index, Some((m.get_channel_name().to_string(), said)))
                                })
                                .chain(stream::once(async move { (index, None) }));
                            streams.push(Box::pin(payloads));
                        }
                        Err(e) => {
                            self.stats.redis_errors.incr();
                            self.report(
                                "sentinel",
                                None,
                                format!("Redis Sentinel subscription failed: {e}"),
                            );
                        }
                    }
                }
                let listening = up.contains(&true);
                retry_at = Instant::now()
                    + if listening {
                        RESUBSCRIBE_PERIOD
                    } else {
                        POLL_PERIOD
                    };
                // A failover announced while nothing was subscribed was not heard.
                if any {
                    self.check_master(None).await;
                }
            }
            let listening = up.contains(&true);
            tokio::select! {
                _ = until_true(&mut shutdown) => return,
                Some((index, payload)) = streams.next(), if !streams.is_empty() => match payload {
                    Some((channel, payload)) => {
                        if let Some(to) = announced_master(&channel, &payload, &name) {
                            self.check_master(Some(to)).await;
                        }
                    }
                    None => {
                        up[index] = false;
                        retry_at = Instant::now();
                    }
                },
                _ = tokio::time::sleep(POLL_PERIOD) => {
                    if !listening {
                        self.check_master(None).await;
                    }
                }
            }
        }
    }

    /// Asks the sentinels where the master is (the announcement `announced` stands if none
    /// answers) and follows it there if it moved.
    async fn check_master(&self, announced: Option<Address>) {
        let topology = &self.link.topology;
        let (at, epoch) = match (topology.ask_master().await, announced) {
            (Some((at, epoch)), _) => (at, Some(epoch)),
            (None, Some(at)) => (at, None),
            (None, None) => return,
        };
        if topology.learned(at, epoch) {
            self.link.master_moved();
            // Skipped because the old master failed: the new one is tried at the next call.
            self.health.retry_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::topology::announced_master;

    #[test]
    fn announcements_are_read_for_their_master_only() {
        let at = Some(("127.0.0.1".to_string(), 6381));
        let switched = "mymaster 127.0.0.1 6380 127.0.0.1 6381";
        assert_eq!(announced_master("+switch-master", switched, "mymaster"), at);
        assert_eq!(announced_master("+switch-master", switched, "other"), None);
        let promoted = "slave 127.0.0.1:6381 127.0.0.1 6381 @ mymaster 127.0.0.1 6380";
        assert_eq!(
            announced_master("+promoted-slave", promoted, "mymaster"),
            at
        );
        assert_eq!(announced_master("+promoted-slave", promoted, "other"), None);
        // A channel's payload read as another's, or cut short, names nothing.
        assert_eq!(
            announced_master("+promoted-slave", switched, "mymaster"),
            None
        );
        assert_eq!(
            announced_master("+switch-master", "mymaster 127.0.0.1 6380", "mymaster"),
            None
        );
        assert_eq!(
            announced_master("+switch-master", "mymaster a 1 b notaport", "mymaster"),
            None
        );
    }
}
