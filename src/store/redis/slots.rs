//! A Cluster's slot map of our own: which master serves each of the 16,384 slots, read from a
//! `CLUSTER SLOTS` reply, so a batch can put all of one node's keys in one pipeline. The redis
//! crate keeps its own map private; it routes each pipeline by a key we name, and the nodes
//! refuse (MOVED, ASK) any key they do not serve, so a map that is stale or wrong costs a
//! redirect, never a value read from the wrong node.
//!
//! The reply is network bytes: it is read with bounds. At most one range per slot, slots in
//! 0..16384, ranges that do not overlap, node names of bounded length, and nothing allocated
//! beyond the fixed table and one name per node. A reply outside that is refused whole (the
//! batch then goes per slot, as the crate routes it); a slot no range names has no owner here.

use std::collections::HashMap;

use redis::Value;

/// How many slots a Redis Cluster has.
pub const SLOTS: usize = 16_384;

/// No owner in `SlotMap::owner`.
const NONE: u16 = u16::MAX;

/// The longest node name (a node id is 40 hex digits; a host name at most 255 bytes).
const MAX_NAME: usize = 300;

/// Which node serves each slot, nodes numbered in order of first appearance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// `owner[slot]`: the number of the node that serves it, or `NONE`.
    owner: Box<[u16]>,
    /// `addresses[node]`: where the node with that number is reached (host and port, as the
    /// reply gave them when it first named it), or `None` when the reply gave no host.
    addresses: Vec<Option<(String, u16)>>,
}

impl SlotMap {
    /// The map a `CLUSTER SLOTS` reply describes: `[[start, end, [host, port, id?, ...],
    /// replicas...], ...]`. A node is named by its id when the reply gives one (Redis 4 on),
    /// else by host and port. A range whose master is unknown (host `?`) leaves its slots
    /// without an owner. `Err`: why the reply is refused.
    pub fn parse(reply: &Value) -> Result<SlotMap, &'static str> {
        let Value::Array(ranges) = reply else {
            return Err("not an array");
        };
        if ranges.len() > SLOTS {
            return Err("more ranges than slots");
        }
        let mut owner = vec![NONE; SLOTS].into_boxed_slice();
        let mut names: HashMap<Vec<u8>, u16> = HashMap::new();
        let mut addresses = Vec::new();
        let mut claimed = vec![false; SLOTS];
        for range in ranges {
            let Value::Array(parts) = range else {
                return Err("a range is not an array");
            };
            let (Some(start), Some(end)) = (slot_of(parts.first()), slot_of(parts.get(1))) else {
                return Err("a range's bounds are not slots");
            };
            if start > end {
                return Err("a range ends before it starts");
            }
            if claimed[start..=end].iter().any(|&c| c) {
                return Err("ranges overlap");
            }
            claimed[start..=end].iter_mut().for_each(|c| *c = true);
            let Some(name) = node_name(parts.get(2))? else {
                continue;
            };
            let next = names.len();
            let node = *names.entry(name).or_insert(next as u16);
            if usize::from(node) == addresses.len() {
                addresses.push(master_address(parts.get(2)));
            }
            owner[start..=end].iter_mut().for_each(|o| *o = node);
        }
        Ok(SlotMap { owner, addresses })
    }

    /// Where node `node` (from `node_of`) is reached, if the reply said.
    pub fn address_of(&self, node: u16) -> Option<(&str, u16)> {
        match self.addresses.get(usize::from(node)) {
            Some(Some((host, port))) => Some((host.as_str(), *port)),
            _ => None,
        }
    }

    /// The node that serves `slot`, if the map names one.
    pub fn node_of(&self, slot: u16) -> Option<u16> {
        match self.owner.get(slot as usize) {
            Some(&n) if n != NONE => Some(n),
            _ => None,
        }
    }

    /// How many nodes serve slots.
    #[cfg(test)]
    fn nodes(&self) -> usize {
        let mut seen: Vec<u16> = self.owner.iter().copied().filter(|&n| n != NONE).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

/// The slot of a Redis key, as Redis computes it: CRC16 (XMODEM) of the key's hash tag (the
/// bytes between its first `{` and the next `}`, when not empty) or of the whole key, modulo
/// 16,384. The redis crate computes the same (`Slot::for_key`) but does not give the number.
pub fn slot_of_key(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
        crc = (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc % SLOTS as u16
}

/// CRC16-XMODEM (polynomial 0x1021) by byte.
static CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The most node addresses read from one `CLUSTER SLOTS` reply: far above any real cluster
/// (Redis advises at most about 1,000 nodes), low enough that a hostile reply cannot make the
/// reader hold more than a few hundred KiB of names.
pub const MAX_ADDRESSES: usize = 4_096;

/// The node addresses a `CLUSTER SLOTS` reply names, each once, in order of first appearance:
/// every range's master, and with `replicas` its replicas too. Read with the map's bounds (at
/// most one range per slot, host names of bounded length, ports that are ports, at most
/// `MAX_ADDRESSES`); a node whose host is unknown (`?`) is left out. `Err`: why it is refused.
pub fn addresses(reply: &Value, replicas: bool) -> Result<Vec<(String, u16)>, &'static str> {
    let Value::Array(ranges) = reply else {
        return Err("not an array");
    };
    if ranges.len() > SLOTS {
        return Err("more ranges than slots");
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err("a range is not an array");
        };
        let nodes = parts.get(2..).unwrap_or_default();
        let nodes = if replicas {
            nodes
        } else {
            &nodes[..nodes.len().min(1)]
        };
        for node in nodes {
            let Value::Array(fields) = node else {
                return Err("a node is not an array");
            };
            let host = text(fields.first()).ok_or("a node's host is not a string")?;
            if host.len() > MAX_NAME {
                return Err("a host name is too long");
            }
            let port = match fields.get(1) {
                Some(Value::Int(p)) if (0..=65_535).contains(p) => *p as u16,
                _ => return Err("a node's port is not a port"),
            };
            if host == b"?" {
                continue;
            }
            let address = (String::from_utf8_lossy(host).into_owned(), port);
            if seen.insert(address.clone()) {
                if out.len() == MAX_ADDRESSES {
                    return Err("more nodes than a cluster has");
                }
                out.push(address);
            }
        }
    }
    Ok(out)
}

fn text(v: Option<&Value>) -> Option<&[u8]> {
    match v {
        Some(Value::BulkString(b)) => Some(b.as_slice()),
        Some(Value::SimpleString(s)) => Some(s.as_bytes()),
        _ => None,
    }
}

fn slot_of(v: Option<&Value>) -> Option<usize> {
    match v {
        Some(Value::Int(n)) if (0..SLOTS as i64).contains(n) => Some(*n as usize),
        _ => None,
    }
}

/// A range's master's host and port (`node_name` has checked their bounds), unless its host is
/// empty (the reply then means the address it was asked on).
fn master_address(master: Option<&Value>) -> Option<(String, u16)> {
    let Some(Value::Array(master)) = master else {
        return None;
    };
    let host = text(master.first()).filter(|h| !h.is_empty())?;
    let port = match master.get(1) {
        Some(Value::Int(p)) if (1..=65_535).contains(p) => *p as u16,
        _ => return None,
    };
    Some((String::from_utf8_lossy(host).into_owned(), port))
}

/// The name of a range's master (`Ok(None)`: unknown, `?`), or why it is refused.
fn node_name(master: Option<&Value>) -> Result<Option<Vec<u8>>, &'static str> {
    let Some(Value::Array(master)) = master else {
        return Err("a range has no master");
    };
    let host = match master.first() {
        Some(Value::Nil) => &b""[..],
        v => text(v).ok_or("a master's host is not a string")?,
    };
    if host == b"?" {
        return Ok(None);
    }
    let port = match master.get(1) {
        Some(Value::Int(p)) if (0..=65_535).contains(p) => *p as u16,
        _ => return Err("a master's port is not a port"),
    };
    if let Some(id) = text(master.get(2)).filter(|id| !id.is_empty()) {
        if id.len() > MAX_NAME {
            return Err("a node id is too long");
        }
        let mut name = b"id:".to_vec();
        name.extend_from_slice(id);
        return Ok(Some(name));
    }
    if host.len() > MAX_NAME {
        return Err("a host name is too long");
    }
    let mut name = b"at:".to_vec();
    name.extend_from_slice(host);
    name.extend_from_slice(format!(":{port}").as_bytes());
    Ok(Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: &str, port: i64, id: Option<&str>) -> Value {
        let mut master = vec![bulk(host), Value::Int(port)];
        if let Some(id) = id {
            master.push(bulk(id));
        }
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(master),
            // A replica: never an owner.
            Value::Array(vec![bulk(host), Value::Int(port + 1), bulk("replica")]),
        ])
    }

    #[test]
    fn a_key_s_slot_is_the_one_redis_and_the_redis_crate_compute() {
        use redis::cluster_routing::Slot;
        // Redis's own examples (CLUSTER KEYSLOT).
        assert_eq!(slot_of_key(b"foo"), 12182);
        assert_eq!(slot_of_key(b"somekey"), 11058);
        assert_eq!(
            slot_of_key(b"{user1000}.following"),
            slot_of_key(b"user1000")
        );
        let keys: Vec<Vec<u8>> = [
            &b""[..],
            b"{}",
            b"{}a",
            b"a{}",
            b"{a}{b}",
            b"x{a}y",
            b"{a",
            b"a}",
            b"}{a}",
            b"{{a}}",
            b"ns:v:{k}",
            b"ns:lock:{k}",
            "ns:v:{ключ}".as_bytes(),
            b"\xff\x00",
        ]
        .iter()
        .map(|k| k.to_vec())
        .chain((0..2_000).map(|i| format!("sc:v:{{key-{i}}}").into_bytes()))
        .collect();
        for key in keys {
            let ours = Slot::new(slot_of_key(&key)).expect("a slot");
            assert_eq!(
                ours,
                Slot::for_key(&key),
                "{:?}",
                String::from_utf8_lossy(&key)
            );
        }
    }

    #[test]
    fn every_slot_of_a_range_belongs_to_its_master_named_by_id() {
        let reply = Value::Array(vec![
            range(0, 5459, "127.0.0.1", 7000, Some("a")),
            range(5460, 5460, "127.0.0.1", 7001, Some("b")),
            range(5461, 10922, "127.0.0.1", 7001, Some("b")),
            range(10923, 16383, "10.0.0.9", 7000, Some("c")),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.nodes(), 3);
        assert_eq!(map.node_of(0), Some(0));
        assert_eq!(map.node_of(5459), Some(0));
        assert_eq!(map.node_of(5460), Some(1));
        assert_eq!(map.node_of(10922), Some(1));
        assert_eq!(map.node_of(16383), Some(2));
        assert_eq!(map.node_of(16384), None);
        // Each node's address, for its read lane.
        assert_eq!(map.address_of(0), Some(("127.0.0.1", 7000)));
        assert_eq!(map.address_of(1), Some(("127.0.0.1", 7001)));
        assert_eq!(map.address_of(2), Some(("10.0.0.9", 7000)));
        assert_eq!(map.address_of(3), None);
        // A master named without a host (the address it was asked on) has none here.
        let hostless = Value::Array(vec![range(0, 16383, "", 7000, Some("a"))]);
        assert_eq!(SlotMap::parse(&hostless).unwrap().address_of(0), None);
    }

    #[test]
    fn without_ids_nodes_are_named_by_host_and_port() {
        let reply = Value::Array(vec![
            range(0, 99, "127.0.0.1", 7000, None),
            range(100, 199, "127.0.0.1", 7001, None),
            range(200, 299, "127.0.0.1", 7000, None),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.nodes(), 2);
        assert_eq!(map.node_of(250), map.node_of(50));
        assert_ne!(map.node_of(150), map.node_of(50));
        // Slots no range names, and a master the node does not know (`?`), have no owner.
        assert_eq!(map.node_of(300), None);
        let unknown = Value::Array(vec![range(0, 99, "?", 7000, Some("a"))]);
        assert_eq!(SlotMap::parse(&unknown).unwrap().node_of(5), None);
    }

    #[test]
    fn addresses_are_each_node_once_and_bounded_as_the_map() {
        let reply = Value::Array(vec![
            range(0, 99, "a", 7000, Some("1")),
            range(100, 199, "b", 7002, None),
            range(200, 299, "a", 7000, Some("1")),
            range(300, 399, "?", 7004, None),
        ]);
        let masters = addresses(&reply, false).unwrap();
        assert_eq!(masters, [("a".into(), 7000), ("b".into(), 7002)]);
        let all = addresses(&reply, true).unwrap();
        assert_eq!(
            all,
            [
                ("a".into(), 7000),
                ("a".into(), 7001),
                ("b".into(), 7002),
                ("b".into(), 7003),
            ]
        );
        // Refused, not truncated or wrapped: more ranges than slots, a port that is no port,
        // a host past the bound, more distinct nodes than the bound.
        let many: Vec<Value> = (0..SLOTS as i64 + 1)
            .map(|i| range(0, 0, "h", i % 60_000, None))
            .collect();
        assert!(addresses(&Value::Array(many), false).is_err());
        let port = Value::Array(vec![range(0, 5, "h", 70_000, None)]);
        assert!(addresses(&port, false).is_err());
        let host = Value::Array(vec![range(0, 5, &"h".repeat(MAX_NAME + 1), 1, None)]);
        assert!(addresses(&host, false).is_err());
        let distinct: Vec<Value> = (0..MAX_ADDRESSES as i64 + 1)
            .map(|i| range(0, 0, &format!("h{i}"), 1, None))
            .collect();
        assert!(addresses(&Value::Array(distinct), false).is_err());
    }

    #[test]
    fn a_reply_out_of_bounds_is_refused_whole() {
        let cases = [
            Value::Nil,
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![range(0, 16384, "h", 1, Some("a"))]),
            Value::Array(vec![range(-1, 5, "h", 1, Some("a"))]),
            Value::Array(vec![range(9, 5, "h", 1, Some("a"))]),
            Value::Array(vec![range(0, 5, "h", 70_000, Some("a"))]),
            Value::Array(vec![
                range(0, 5, "h", 1, Some("a")),
                range(5, 9, "h", 2, Some("b")),
            ]),
            Value::Array(vec![range(0, 5, "h", 1, Some(&"x".repeat(MAX_NAME + 1)))]),
            Value::Array(vec![range(0, 5, &"h".repeat(MAX_NAME + 1), 1, None)]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(5),
                Value::Int(7),
            ])]),
            Value::Array(vec![range(0, 0, "h", 1, None); SLOTS + 1]),
        ];
        for reply in cases {
            let parsed = SlotMap::parse(&reply);
            assert!(parsed.is_err(), "{reply:?} gave {parsed:?}");
        }
    }

    #[test]
    fn any_bytes_in_any_shape_are_parsed_or_refused_without_panic() {
        // A cheap fuzz: nested values built from a seeded generator.
        fn value(seed: &mut u64, depth: u32) -> Value {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pick = (*seed >> 33) % 6;
            match (pick, depth) {
                (0, _) => Value::Int(((*seed >> 20) % 20_000) as i64 - 100),
                (1, _) => Value::BulkString(vec![b'a'; ((*seed >> 40) % 5) as usize]),
                (2, _) => Value::Nil,
                (3, _) => bulk("?"),
                (_, 0) => Value::Int(1),
                _ => {
                    let n = ((*seed >> 45) % 5) as usize;
                    Value::Array((0..n).map(|_| value(seed, depth - 1)).collect())
                }
            }
        }
        let mut seed = 7;
        for _ in 0..5_000 {
            let v = value(&mut seed, 4);
            if let Ok(map) = SlotMap::parse(&v) {
                assert!(map.nodes() <= SLOTS);
            }
        }
    }
}
