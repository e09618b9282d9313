//! Cache keys: validation of string keys and the unambiguous encoding of array keys.
//!
//! An array key's parts are joined with `:`, and `\` and `:` inside a part are escaped with `\`,
//! so `['a:b','c']` becomes `a\:b:c` and `['a','b:c']` becomes `a:b\:c`: distinct, and still
//! readable in Redis (`['user', 42]` is `user:42`).

use crate::error::{Error, ErrorCode, Result};

/// The longest key accepted, in UTF-8 bytes of the (encoded) key.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a string key: non-empty and at most [`MAX_KEY_BYTES`] bytes.
pub fn check(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(ErrorCode::InvalidKey, "key must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::new(
            ErrorCode::InvalidKey,
            format!(
                "key is {} bytes long; the limit is {MAX_KEY_BYTES}",
                key.len()
            ),
        ));
    }
    Ok(())
}

/// Encodes the parts of an array key (numbers already turned into their JS string form).
pub fn encode_parts<S: AsRef<str>>(parts: &[S]) -> Result<String> {
    if parts.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidKey,
            "an array key needs at least one part",
        ));
    }
    let mut out = String::with_capacity(parts.iter().map(|p| p.as_ref().len() + 1).sum());
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        for ch in part.as_ref().chars() {
            if ch == ':' || ch == '\\' {
                out.push('\\');
            }
            out.push(ch);
        }
        if out.len() > MAX_KEY_BYTES {
            break; // reported by `check` below; no need to encode the rest
        }
    }
    check(&out)?;
    Ok(out)
}

/// A Redis key name for `key` under `segment`. The braces make `key` the Redis Cluster hash tag,
/// so a key's value, lock and generation share a slot (and one Lua script may touch them all).
/// A key holding `}` would end the tag early (`}x` would even make it empty, and each name would
/// hash on its own): such keys are written hex-encoded, under segments of their own (`vx`,
/// `lockx`, `genx`), so they can never meet a plain key.
fn tagged(namespace: &str, segment: &str, key: &str) -> String {
    if key.contains('}') {
        let mut hex = String::with_capacity(key.len() * 2);
        for b in key.bytes() {
            hex.push_str(&format!("{b:02x}"));
        }
        format!("{namespace}:{segment}x:{{{hex}}}")
    } else {
        format!("{namespace}:{segment}:{{{key}}}")
    }
}

/// The Redis key holding `key`'s envelope.
pub fn redis_value_key(namespace: &str, key: &str) -> String {
    tagged(namespace, "v", key)
}

/// [`crate::envelope::key_mark_bits`] of [`redis_value_key`], taken over the key's parts as
/// `tagged` spells them, with no String made (a read's per-key check of the mark a value
/// carries).
pub fn value_key_mark(namespace: &str, key: &str) -> u64 {
    use crate::envelope::{key_mark_extend, KEY_MARK_START};
    let h = key_mark_extend(KEY_MARK_START, namespace.as_bytes());
    if key.contains('}') {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut h = key_mark_extend(h, b":vx:{");
        for b in key.bytes() {
            let pair = [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]];
            h = key_mark_extend(h, &pair);
        }
        key_mark_extend(h, b"}")
    } else {
        let h = key_mark_extend(h, b":v:{");
        key_mark_extend(key_mark_extend(h, key.as_bytes()), b"}")
    }
}

/// Appends a RESP `GET` of the Redis key holding `key`'s envelope to `out`, with no String made
/// on the way (a read lane's request; the same bytes as the redis crate's packed command).
pub fn write_value_get(namespace: &str, key: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
    write_value_key(namespace, key, out);
}

/// Appends a RESP `MGET` of the Redis keys holding `keys`' envelopes to `out` (a batch read on
/// the read lane), with no String made on the way for a key without `}`.
pub fn write_value_mget(namespace: &str, keys: &[String], out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(out, "*{}\r\n$4\r\nMGET\r\n", keys.len() + 1);
    for key in keys {
        write_value_key(namespace, key, out);
    }
}

/// Appends the Redis key holding `key`'s envelope to `out` as a RESP bulk string.
fn write_value_key(namespace: &str, key: &str, out: &mut Vec<u8>) {
    use std::io::Write;
    if key.contains('}') {
        let name = redis_value_key(namespace, key);
        let _ = write!(out, "${}\r\n", name.len());
        out.extend_from_slice(name.as_bytes());
    } else {
        // As `tagged` spells it: {namespace}:v:{{key}}.
        let len = namespace.len() + ":v:{".len() + key.len() + 1;
        let _ = write!(out, "${len}\r\n");
        out.extend_from_slice(namespace.as_bytes());
        out.extend_from_slice(b":v:{");
        out.extend_from_slice(key.as_bytes());
        out.push(b'}');
    }
    out.extend_from_slice(b"\r\n");
}

/// The Redis key of `key`'s refresh lock.
pub fn redis_lock_key(namespace: &str, key: &str) -> String {
    tagged(namespace, "lock", key)
}

/// The Redis key of `key`'s generation in earlier versions (changed by every `set` and `delete`,
/// so their loads could tell their result was older); this one only removes it (`write.lua`).
pub fn redis_generation_key(namespace: &str, key: &str) -> String {
    tagged(namespace, "gen", key)
}

/// The Redis key of a tag: the namespace clock of the newest `deleteByTag` of it. Tags are
/// spelled like keys (hex under `tagx` if they hold `}`), each on its own cluster slot.
pub fn redis_tag_key(namespace: &str, tag: &str) -> String {
    tagged(namespace, "tag", tag)
}

/// The Redis key of a tag's expiry: the namespace clock of the newest `expireByTag` of it (an
/// entry carrying the tag born before it is stale). On the tag key's cluster slot.
pub fn redis_tag_stale_key(namespace: &str, tag: &str) -> String {
    tagged(namespace, "stale", tag)
}

/// The namespace's hash: `clock` (advanced by every `deleteByTag` and `clear`) and `cleared`
/// (the clock of the newest `clear`).
pub fn redis_meta_key(namespace: &str) -> String {
    format!("{namespace}:meta")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_get_is_the_packed_command_of_the_value_key() {
        for key in [
            "a",
            "user:42",
            "é,ü",
            "with}brace",
            "{x}",
            &"k".repeat(1024),
        ] {
            for ns in ["sc", "", "a:b"] {
                let mut out = b"before".to_vec();
                write_value_get(ns, key, &mut out);
                let mut expected = b"before".to_vec();
                redis::cmd("GET")
                    .arg(redis_value_key(ns, key))
                    .write_packed_command(&mut expected);
                assert_eq!(out, expected, "{ns} {key}");
            }
        }
    }

    #[test]
    fn a_lane_mget_is_the_packed_command_of_the_value_keys() {
        let keys: Vec<String> = ["a", "user:42", "é,ü", "with}brace", "{x}"]
            .iter()
            .map(|k| k.to_string())
            .collect();
        for ns in ["sc", "", "a:b"] {
            let mut out = b"before".to_vec();
            write_value_mget(ns, &keys, &mut out);
            let mut expected = b"before".to_vec();
            let mut cmd = redis::cmd("MGET");
            for k in &keys {
                cmd.arg(redis_value_key(ns, k));
            }
            cmd.write_packed_command(&mut expected);
            assert_eq!(out, expected, "{ns}");
        }
    }

    #[test]
    fn a_value_key_mark_is_the_mark_of_the_value_key() {
        for key in [
            "a",
            "user:42",
            "é,ü",
            "with}brace",
            "{x}",
            "}",
            "\u{0}\u{7f}}\u{ff}",
            &"k".repeat(1024),
        ] {
            for ns in ["sc", "", "a:b", "x}"] {
                assert_eq!(
                    value_key_mark(ns, key),
                    crate::envelope::key_mark_bits(&redis_value_key(ns, key)),
                    "{ns} {key}"
                );
            }
        }
        assert_ne!(value_key_mark("sc", "a"), value_key_mark("sc", "b"));
    }

    proptest::proptest! {
        #[test]
        fn proptest_a_value_key_mark_is_the_mark_of_the_value_key(
            ns in "[a-z:}]{0,6}",
            key in proptest::prelude::any::<String>(),
        ) {
            proptest::prop_assert_eq!(
                value_key_mark(&ns, &key),
                crate::envelope::key_mark_bits(&redis_value_key(&ns, &key))
            );
        }
    }

    #[test]
    fn parts_with_separators_stay_distinct() {
        let a = encode_parts(&["a:b", "c"]).unwrap();
        let b = encode_parts(&["a", "b:c"]).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, "a\\:b:c");
        assert_eq!(b, "a:b\\:c");
    }

    #[test]
    fn backslashes_cannot_forge_a_separator() {
        // ['a\\', 'b'] must not equal ['a\\:b'] nor ['a', 'b'].
        let x = encode_parts(&["a\\", "b"]).unwrap();
        let y = encode_parts(&["a\\:b"]).unwrap();
        let z = encode_parts(&["a", "b"]).unwrap();
        assert_ne!(x, y);
        assert_ne!(x, z);
        assert_ne!(y, z);
    }

    #[test]
    fn redis_keys_are_readable_and_share_a_slot() {
        assert_eq!(redis_value_key("sc", "user:42"), "sc:v:{user:42}");
        assert_eq!(redis_lock_key("sc", "user:42"), "sc:lock:{user:42}");
        assert_eq!(redis_generation_key("sc", "user:42"), "sc:gen:{user:42}");
        assert_eq!(redis_tag_key("sc", "user:42"), "sc:tag:{user:42}");
        assert_eq!(redis_tag_key("sc", "a}b"), "sc:tagx:{617d62}");
        assert_eq!(redis_tag_stale_key("sc", "user:42"), "sc:stale:{user:42}");
        assert_eq!(
            hash_tag(&redis_tag_stale_key("sc", "a}b")),
            hash_tag(&redis_tag_key("sc", "a}b"))
        );
        assert_eq!(redis_meta_key("sc"), "sc:meta");
    }

    /// The hash tag Redis Cluster hashes: between the first `{` and the next `}`, if not empty.
    fn hash_tag(name: &str) -> &str {
        if let Some(open) = name.find('{') {
            if let Some(len) = name[open + 1..].find('}') {
                if len > 0 {
                    return &name[open + 1..open + 1 + len];
                }
            }
        }
        name
    }

    #[test]
    fn every_key_keeps_its_names_on_one_slot() {
        for key in ["plain", "}x", "a}b", "{", "{a}", "}", "a{b}c}", "x}}"] {
            let tag = hash_tag(&redis_value_key("sc", key)).to_string();
            assert_eq!(hash_tag(&redis_lock_key("sc", key)), tag, "{key}");
            assert_eq!(hash_tag(&redis_generation_key("sc", key)), tag, "{key}");
        }
        // Escaped keys never meet plain ones: `}` itself is never in a plain name's tag.
        assert_eq!(redis_value_key("sc", "}x"), "sc:vx:{7d78}");
        assert_ne!(redis_value_key("sc", "7d78"), redis_value_key("sc", "}x"));
        assert_eq!(
            redis_value_key("sc", "user:{42}"),
            "sc:vx:{757365723a7b34327d}"
        );
        assert_eq!(redis_value_key("sc", "user:{42"), "sc:v:{user:{42}");
    }

    #[test]
    fn plain_parts_read_naturally() {
        assert_eq!(encode_parts(&["user", "42"]).unwrap(), "user:42");
        assert_eq!(encode_parts(&["", ""]).unwrap(), ":");
    }

    #[test]
    fn empty_and_oversized_keys_are_rejected() {
        assert_eq!(check("").unwrap_err().code, ErrorCode::InvalidKey);
        assert!(check(&"x".repeat(MAX_KEY_BYTES)).is_ok());
        assert_eq!(
            check(&"x".repeat(MAX_KEY_BYTES + 1)).unwrap_err().code,
            ErrorCode::InvalidKey
        );
        // Bytes, not characters: 342 three-byte characters are 1,026 bytes.
        assert!(check(&"€".repeat(342)).is_err());
        let empty: [&str; 0] = [];
        assert_eq!(
            encode_parts(&empty).unwrap_err().code,
            ErrorCode::InvalidKey
        );
        assert!(encode_parts(&[""]).is_err());
        assert!(encode_parts(&["x".repeat(600), "y".repeat(600)]).is_err());
    }
}
