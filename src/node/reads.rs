//! The Redis reads behind `redisGate`, `redisFetch` and the batch calls: the gate and the
//! fetch on napi's tokio runtime, what to do with a read the lane answered, and a read answered
//! from another process's announcement.

use std::sync::Arc;

use super::answer::{answer_of, Landed, RedisAnswer};
use super::codes::{
    lock_code, GATE_CLOSED, GATE_MISSING, GATE_UNAVAILABLE, PURPOSE_COLD, PURPOSE_FORCE,
    PURPOSE_PAST_VALUE, PURPOSE_REFRESH,
};
use super::engines::engine;
use super::flight::Gated;
use super::lane::{LaneAsk, LaneGet};
use super::settle;
use crate::inbox::Stamp;
use crate::store::redis::{Fetched, Gate, LaneRead, LockOutcome, RedisTier, Remote};

/// The tier, and what a refresh gate compares Redis's copy with.
pub(super) type Gating = (Arc<RedisTier>, f64);

/// Which flight of which engine a gate is for.
#[derive(Clone, Copy)]
pub(super) struct For {
    pub id: u32,
    pub flight: u64,
}

/// The gate, on the runtime. `looked`: a cold load whose read lane's GET found nothing usable.
pub(super) async fn gate(
    to: For,
    tier: Option<Gating>,
    key: String,
    purpose: u32,
    stamp: Option<Stamp>,
    looked: bool,
) -> napi::Result<Landed> {
    let Some((tier, local_fresh_until)) = tier else {
        return Ok(Landed {
            id: to.id,
            flight: to.flight,
            answer: RedisAnswer::kind(GATE_CLOSED, stamp),
            gated: Gated::Nothing,
        });
    };
    let (gate, lock) = match purpose {
        PURPOSE_REFRESH => {
            let gate = tier.refresh_gate(&key, local_fresh_until).await;
            // The refresh gate takes the lock before it looks (a value found was refreshed
            // elsewhere meanwhile; the lock is given back): a win, as `lockWins` counts.
            let lock = match &gate {
                Gate::Lead { token: Some(_), .. } | Gate::Found(_) => LockOutcome::Won,
                Gate::Skip => LockOutcome::Skipped,
                _ => LockOutcome::None,
            };
            (gate, lock)
        }
        PURPOSE_FORCE => (tier.force_gate(&key).await, LockOutcome::None),
        PURPOSE_PAST_VALUE => tier.cold_gate_observed(&key, true, false).await,
        _ => tier.cold_gate_observed(&key, false, looked).await,
    };
    // Closed while asking: no loader runs, and a lock just taken is given back at once.
    let gate = if tier.closed() {
        if let Gate::Lead {
            token: Some(token), ..
        } = &gate
        {
            tier.release(&key, token, true).await;
        }
        Gate::Closed
    } else {
        gate
    };
    let (answer, gated) = answer_of(&tier, &key, gate, lock_code(lock), stamp);
    Ok(Landed {
        id: to.id,
        flight: to.flight,
        answer,
        gated,
    }
    .reporting(&tier))
}

pub(super) async fn fetch(
    tier: Option<Arc<RedisTier>>,
    key: String,
    stamp: Option<Stamp>,
    count: bool,
) -> napi::Result<RedisAnswer> {
    let (Some(tier), Some(stamp)) = (tier, stamp) else {
        return Ok(RedisAnswer::kind(GATE_UNAVAILABLE, None));
    };
    let answer = match tier.fetch(&key, stamp, count).await {
        Fetched::Found(r) => RedisAnswer::found(r),
        Fetched::Missing => RedisAnswer::kind(GATE_MISSING, None),
        Fetched::Unavailable => RedisAnswer::kind(GATE_UNAVAILABLE, None),
    };
    Ok(answer.reporting(&tier))
}

/// Settles a read the lane answered (`read`), or asks again on the command connection (`None`:
/// the lane failed or was dropped before it answered). On the JS thread, in a handle scope.
pub(super) fn settle_lane_read(
    env: napi::sys::napi_env,
    tier: &Arc<RedisTier>,
    promised: settle::Promised,
    get: LaneGet,
    read: Option<LaneRead>,
) {
    let LaneGet { key, stamp, ask } = get;
    let to = match ask {
        LaneAsk::Cold { id, flight } => For { id, flight },
        LaneAsk::Fetch { count } => {
            let answer = match read {
                Some(LaneRead::Found(r)) => RedisAnswer::found(r),
                Some(LaneRead::Missing) => RedisAnswer::kind(GATE_MISSING, None),
                Some(LaneRead::Ask | LaneRead::Misaligned(_)) | None => {
                    settle::spawn_into(
                        promised,
                        fetch(Some(tier.clone()), key, Some(stamp), count),
                    );
                    return;
                }
            };
            settle::settle_here(env, promised, Ok(answer.reporting(tier)));
            return;
        }
    };
    let landed = match read {
        Some(LaneRead::Found(r)) if tier.closed() => {
            drop(r);
            Landed {
                id: to.id,
                flight: to.flight,
                answer: RedisAnswer::kind(GATE_CLOSED, Some(stamp)),
                gated: Gated::Nothing,
            }
        }
        Some(LaneRead::Found(r)) => {
            let (answer, gated) = RedisAnswer::found_for_flight(r);
            Landed {
                id: to.id,
                flight: to.flight,
                answer,
                gated,
            }
        }
        // The lock script runs next, without a GET of its own first.
        Some(LaneRead::Missing) => {
            let tier = Some((tier.clone(), 0.0));
            settle::spawn_into(
                promised,
                gate(to, tier, key, PURPOSE_COLD, Some(stamp), true),
            );
            return;
        }
        Some(LaneRead::Ask | LaneRead::Misaligned(_)) | None => {
            let tier = Some((tier.clone(), 0.0));
            settle::spawn_into(
                promised,
                gate(to, tier, key, PURPOSE_COLD, Some(stamp), false),
            );
            return;
        }
    };
    settle::settle_here(env, promised, Ok(landed.reporting(tier)));
}

/// The envelope another process's announcement carried for `key` (see
/// `store/redis/carried.rs`), if nothing was heard of the key since: the read needs no Redis
/// round trip. `count` (for `get`): counted as an l2Hit. With the tier, for its reports.
fn carried_remote(id: u32, key: &str, count: bool) -> Option<(Remote, Arc<RedisTier>)> {
    let e = engine(id)?;
    let (tier, stamp) = {
        let e = e.borrow();
        if e.cache.is_closed() {
            return None;
        }
        (e.redis.clone()?, e.cache.inbox().stamp(key))
    };
    let found = tier.take_carried(key, stamp)?;
    if count {
        tier.count_l2_hit();
    }
    Some((found, tier))
}

/// A read answered from an announcement, as a found answer.
pub(super) fn carried(id: u32, key: &str, count: bool) -> Option<RedisAnswer> {
    let (found, tier) = carried_remote(id, key, count)?;
    Some(RedisAnswer::found(found).reporting(&tier))
}

/// A cold gate of flight `to` answered from an announcement.
pub(super) fn carried_gate(to: For, key: &str) -> Option<Landed> {
    let (found, tier) = carried_remote(to.id, key, false)?;
    let (answer, gated) = RedisAnswer::found_for_flight(found);
    Some(
        Landed {
            id: to.id,
            flight: to.flight,
            answer,
            gated,
        }
        .reporting(&tier),
    )
}
