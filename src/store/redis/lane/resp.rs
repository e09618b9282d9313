//! RESP framing of the read lane's input: one reply at a time, as a GET (or the handshake's
//! commands) can be answered. Input is untrusted: framing never recurses and never waits for a
//! declared length past Redis's own ceiling; anything else is a `ProtocolError`, on which the lane
//! closes.

/// One reply, framed from the lane's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A bulk string (`$n`): the value.
    Bulk(&'a [u8]),
    /// A null bulk string or array (`$-1`, `*-1`): no such key.
    Nil,
    /// An error reply (`-...`), without the dash.
    Error(&'a [u8]),
    /// Anything else a GET does not answer with (a status, an integer).
    Other,
}

/// The longest bulk reply the lane waits for: Redis's own ceiling for a string (512 MiB).
pub const MAX_BULK_LEN: i64 = 512 * 1024 * 1024;

/// The most bytes one batch read's reply may span (the command connection's bound, see
/// `guard::scan::MAX_REPLY_BYTES`): many values near the ceiling are refused, not waited for.
pub const MAX_REPLY_BYTES: usize = 1 << 30;

/// The input is not RESP2 as a GET is answered: the lane cannot know where the next reply
/// starts, or the reply cannot be one it asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError;

/// The first reply in `buf` and its length in bytes, or `None` if it is not complete yet.
pub fn frame(buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>, ProtocolError> {
    let Some(len) = frame_len(buf, 0)? else {
        return Ok(None);
    };
    let line_end = line(buf, 1)?.expect("a framed reply has its first line");
    let reply = match buf[0] {
        b'$' if buf[1] == b'-' => Reply::Nil,
        b'$' => Reply::Bulk(&buf[line_end + 2..len - 2]),
        b'*' if buf[1] == b'-' => Reply::Nil,
        b'-' => Reply::Error(&buf[1..line_end]),
        _ => Reply::Other,
    };
    Ok(Some((reply, len)))
}

/// What a batch read's `MGET` (see `frame_values`) was answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Values<'a> {
    /// One element per key asked, in order: a value, or `None` (no such key, or not a string).
    Each(Vec<Option<&'a [u8]>>),
    /// An error reply: the MGET refused as a whole (an ACL without it, say).
    Error(&'a [u8]),
    /// A reply no MGET of that many keys gives: a bulk string, a status, an integer, a nil, an
    /// array of another length. The lane is out of step.
    Other,
}

/// The first reply in `buf`, read as the answer to an `MGET` of `keys` keys, and its length in
/// bytes, or `None` if it is not complete yet. An MGET's reply is one flat array of bulk strings
/// and nils; an array of exactly `keys` elements is framed element by element (never recursing:
/// an element that is not a bulk string or a nil is a `ProtocolError`), bounded by
/// `MAX_REPLY_BYTES` in all and `MAX_BULK_LEN` per element, so a reply that declares more than
/// the keys asked, or longer values than Redis can hold, is never waited for.
pub fn frame_values(buf: &[u8], keys: usize) -> Result<Option<(Values<'_>, usize)>, ProtocolError> {
    frame_values_within(buf, keys, MAX_REPLY_BYTES)
}

/// `frame_values` with `max_bytes` for the bound on the whole reply.
fn frame_values_within(
    buf: &[u8],
    keys: usize,
    max_bytes: usize,
) -> Result<Option<(Values<'_>, usize)>, ProtocolError> {
    if buf.first() != Some(&b'*') {
        return Ok(frame(buf)?.map(|(reply, len)| {
            let values = match reply {
                Reply::Error(e) => Values::Error(e),
                _ => Values::Other,
            };
            (values, len)
        }));
    }
    let Some(end) = line(buf, 1)? else {
        return Ok(None);
    };
    let declared = number(&buf[1..end])?;
    let mut at = end + 2;
    if declared < 0 || declared as u64 != keys as u64 {
        // A nil, or an array that is not one element per key: out of step, without looking
        // inside (however deep or long it claims to be, nothing of it is waited for).
        return Ok(Some((Values::Other, at)));
    }
    let mut each = Vec::with_capacity(keys);
    for _ in 0..keys {
        if buf.len() <= at {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(ProtocolError);
        }
        // The element's declared length, before its body is waited for: a reply that would
        // pass the bound is refused at the header that passes it, not once it has arrived.
        let Some(line_end) = line(buf, at + 1)? else {
            return Ok(None);
        };
        let declared = number(&buf[at + 1..line_end])?;
        if line_end + 2 + declared.max(0) as usize + 2 > max_bytes {
            return Err(ProtocolError);
        }
        let Some(len) = frame_len(buf, at)? else {
            return Ok(None);
        };
        if buf[at + 1] == b'-' {
            each.push(None);
        } else {
            each.push(Some(&buf[line_end + 2..at + len - 2]));
        }
        at += len;
    }
    Ok(Some((Values::Each(each), at)))
}

/// Where the line starting at `from` ends (its `\r`), if it has ended.
fn line(buf: &[u8], from: usize) -> Result<Option<usize>, ProtocolError> {
    // Headers are short; a very long one is not RESP.
    let window = &buf[from.min(buf.len())..buf.len().min(from + 4096)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(at) => Ok(Some(from + at)),
        None if window.len() >= 4096 => Err(ProtocolError),
        None => Ok(None),
    }
}

fn number(bytes: &[u8]) -> Result<i64, ProtocolError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtocolError)
}

/// The length of the reply starting at `at`, if it is complete.
fn frame_len(buf: &[u8], at: usize) -> Result<Option<usize>, ProtocolError> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = line(buf, at + 1)? else {
        return Ok(None);
    };
    let after_line = end + 2;
    match kind {
        b'+' | b'-' | b':' => Ok(Some(after_line - at)),
        b'$' => {
            let n = number(&buf[at + 1..end])?;
            if n < 0 {
                return Ok(Some(after_line - at));
            }
            // Redis never sends more (proto-max-bulk-len's ceiling); waiting for more would
            // let the other end grow our memory at will.
            if n > MAX_BULK_LEN {
                return Err(ProtocolError);
            }
            let total = after_line + n as usize + 2;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[total - 2..total] != b"\r\n" {
                return Err(ProtocolError);
            }
            Ok(Some(total - at))
        }
        // A null array is how RESP2 servers may say nil. Any other array, a RESP3 type or a push
        // frame is no reply to a GET or to the handshake's commands: out of protocol, so the
        // lane is closed before it looks inside (no recursion, however deep the nesting).
        b'*' if number(&buf[at + 1..end])? < 0 => Ok(Some(after_line - at)),
        _ => Err(ProtocolError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    #[test]
    fn frames_the_replies_a_get_gives() {
        assert_eq!(frame(b"$3\r\nabc\r\n"), Ok(Some((Reply::Bulk(b"abc"), 9))));
        assert_eq!(frame(b"$0\r\n\r\n+OK\r\n"), Ok(Some((Reply::Bulk(b""), 6))));
        assert_eq!(frame(b"$-1\r\n$1\r\n"), Ok(Some((Reply::Nil, 5))));
        assert_eq!(
            frame(b"-WRONGTYPE Operation\r\n"),
            Ok(Some((Reply::Error(b"WRONGTYPE Operation"), 22)))
        );
        assert_eq!(frame(b"+OK\r\n"), Ok(Some((Reply::Other, 5))));
        assert_eq!(frame(b":12\r\n"), Ok(Some((Reply::Other, 5))));
        assert_eq!(frame(b"*-1\r\n"), Ok(Some((Reply::Nil, 5))));
    }

    #[test]
    fn an_incomplete_reply_waits_for_more_at_every_cut() {
        let bulk: &[u8] = b"$10\r\n0123456789\r\n";
        for cut in 0..bulk.len() {
            assert_eq!(frame(&bulk[..cut]), Ok(None), "cut at {cut}");
        }
        // A value holding CRLF is framed by its length, not by its lines.
        assert_eq!(
            frame(b"$4\r\na\r\nb\r\n"),
            Ok(Some((Reply::Bulk(b"a\r\nb"), 10)))
        );
    }

    #[test]
    fn input_that_is_not_resp_is_refused() {
        assert_eq!(frame(b"hello\r\n"), Err(ProtocolError));
        assert_eq!(frame(b"$x\r\n"), Err(ProtocolError));
        assert_eq!(frame(b"$3\r\nabcde\r\n"), Err(ProtocolError));
        assert_eq!(frame(&[b'+'; 5000]), Err(ProtocolError));
    }

    #[test]
    fn replies_no_get_gives_are_refused_before_they_are_read() {
        // Arrays (however deep), RESP3 types and push frames: refused at their first line.
        assert_eq!(frame(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"), Err(ProtocolError));
        let deep = "*1\r\n".repeat(300_000);
        assert_eq!(frame(deep.as_bytes()), Err(ProtocolError));
        assert_eq!(frame(b"*1\r\n"), Err(ProtocolError), "even incomplete");
        for kind in [b'%', b'~', b'>', b'_', b'#', b',', b'(', b'=', b'|'] {
            let mut reply = vec![kind];
            reply.extend_from_slice(b"1\r\n");
            assert_eq!(frame(&reply), Err(ProtocolError), "kind {}", kind as char);
        }
        // A declared length past Redis's own ceiling is never waited for.
        assert_eq!(frame(b"$1000000000000\r\n"), Err(ProtocolError));
        assert_eq!(frame(b"$9223372036854775807\r\n"), Err(ProtocolError));
        assert_eq!(
            frame(b"$536870912\r\nabc"),
            Ok(None),
            "at the ceiling: waits"
        );
        assert_eq!(frame(b"$536870913\r\n"), Err(ProtocolError));
    }

    #[test]
    fn frames_an_mget_reply_of_one_element_per_key() {
        let reply = b"*3\r\n$1\r\na\r\n$-1\r\n$0\r\n\r\n$2\r\nhi\r\n";
        assert_eq!(
            frame_values(reply, 3),
            Ok(Some((
                Values::Each(vec![Some(&b"a"[..]), None, Some(&b""[..])]),
                22
            )))
        );
        for cut in 0..22 {
            assert_eq!(frame_values(&reply[..cut], 3), Ok(None), "cut at {cut}");
        }
        assert_eq!(
            frame_values(b"-NOPERM no\r\n", 3),
            Ok(Some((Values::Error(b"NOPERM no"), 12)))
        );
    }

    #[test]
    fn an_mget_reply_that_is_not_one_element_per_key_is_out_of_step() {
        // Another length, a nil, a single value: framed as far as their first line only.
        assert_eq!(frame_values(b"*2\r\n", 3), Ok(Some((Values::Other, 4))));
        assert_eq!(
            frame_values(b"*4000000000\r\n", 3),
            Ok(Some((Values::Other, 13)))
        );
        assert_eq!(frame_values(b"*-1\r\n", 3), Ok(Some((Values::Other, 5))));
        assert_eq!(
            frame_values(b"$1\r\na\r\n", 1),
            Ok(Some((Values::Other, 7)))
        );
        assert_eq!(frame_values(b"+OK\r\n", 1), Ok(Some((Values::Other, 5))));
        // Elements no MGET gives (nested arrays, integers) are refused, never recursed into.
        assert_eq!(
            frame_values(b"*1\r\n*1\r\n$1\r\na\r\n", 1),
            Err(ProtocolError)
        );
        assert_eq!(frame_values(b"*1\r\n:1\r\n", 1), Err(ProtocolError));
        assert_eq!(frame_values(b"*1\r\n$536870913\r\n", 1), Err(ProtocolError));
        // Values each within Redis's ceiling, but more than the bound in all: refused at the
        // header that passes it, before its body is waited for.
        // (A bound of 100 bytes here for the 1 GiB of `frame_values`.)
        let body = "x".repeat(40);
        let reply = format!("*3\r\n$40\r\n{body}\r\n$40\r\n{body}\r\n$40\r\n");
        let cut = reply.len() - "$40\r\n".len();
        assert_eq!(
            frame_values_within(&reply.as_bytes()[..cut], 3, 100),
            Ok(None),
            "two fit: waits"
        );
        assert_eq!(
            frame_values_within(reply.as_bytes(), 3, 100),
            Err(ProtocolError),
            "the third's header passes the bound"
        );
    }

    /// Cases per property: `FUZZ_CASES` (`npm run fuzz` sets many more), else 25,000.
    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(25_000)
    }

    /// What a GET (or the handshake) may be answered with, as bytes, and as `frame` reads it.
    fn replies() -> impl proptest::strategy::Strategy<Value = (Vec<u8>, Reply<'static>)> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|v| {
                let mut out = format!("${}\r\n", v.len()).into_bytes();
                out.extend_from_slice(&v);
                out.extend_from_slice(b"\r\n");
                // Leaked for a 'static reply: test data only.
                (out, Reply::Bulk(Box::leak(v.into_boxed_slice())))
            }),
            Just((b"$-1\r\n".to_vec(), Reply::Nil)),
            Just((b"*-1\r\n".to_vec(), Reply::Nil)),
            proptest::collection::vec(b'A'..=b'z', 0..40).prop_map(|e| {
                let e = String::from_utf8(e).unwrap_or_default();
                let out = format!("-{e}\r\n").into_bytes();
                (
                    out,
                    Reply::Error(Box::leak(e.into_bytes().into_boxed_slice())),
                )
            }),
            Just((b"+OK\r\n".to_vec(), Reply::Other)),
            (0i64..1_000_000).prop_map(|n| (format!(":{n}\r\n").into_bytes(), Reply::Other)),
        ]
    }

    /// Frames `input` to the end the way the lane does: replies in order, then whether it
    /// stopped on a protocol error.
    fn frame_all(input: &[u8]) -> (Vec<Reply<'_>>, usize, bool) {
        let mut at = 0;
        let mut out = Vec::new();
        loop {
            match frame(&input[at..]) {
                Ok(Some((reply, len))) => {
                    assert!(len > 0 && at + len <= input.len());
                    out.push(reply);
                    at += len;
                }
                Ok(None) => return (out, at, false),
                Err(ProtocolError) => return (out, at, true),
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(cases()))]

        /// Any bytes at all: an answer, a wait, or a refusal; never a panic or a runaway.
        #[test]
        fn any_bytes_frame_without_panicking(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = frame_all(&input);
        }

    }

    proptest::proptest! {
        // A tenth of the cases: each is 20 times dearer to generate in a debug build.
        #![proptest_config(proptest::test_runner::Config::with_cases(cases() / 10))]

        /// RESP-shaped noise (headers, lengths, nesting, CRLFs in odd places).
        #[test]
        fn resp_shaped_noise_frames_without_panicking(parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("*".to_string()), proptest::strategy::Just("$".to_string()),
                proptest::strategy::Just("\r\n".to_string()), proptest::strategy::Just("-".to_string()),
                proptest::strategy::Just(">".to_string()), proptest::strategy::Just("%".to_string()),
                proptest::prelude::any::<u64>().prop_map(|n| n.to_string()),
                (-999i64..1000).prop_map(|n| n.to_string()),
                proptest::strategy::Just("x".to_string()),
            ], 0..64)) {
            let input = parts.concat();
            let _ = frame_all(input.as_bytes());
        }

        /// Replies a GET can get, back to back and delivered in any cuts: framed whole, in order,
        /// each at the first moment it is complete.
        #[test]
        fn replies_frame_alike_however_they_are_cut(
            sent in proptest::collection::vec(replies(), 1..8),
            cut in 0usize..4096,
        ) {
            let bytes: Vec<u8> = sent.iter().flat_map(|(b, _)| b.clone()).collect();
            let expected: Vec<&Reply<'static>> = sent.iter().map(|(_, r)| r).collect();
            let cut = cut % (bytes.len() + 1);
            let (first, used, failed) = frame_all(&bytes[..cut]);
            proptest::prop_assert!(!failed);
            let (rest, used_rest, failed) = frame_all(&bytes[used..]);
            proptest::prop_assert!(!failed);
            proptest::prop_assert_eq!(used + used_rest, bytes.len());
            let all: Vec<&Reply<'_>> = first.iter().chain(rest.iter()).collect();
            proptest::prop_assert_eq!(all, expected);
        }
    }
}
