//! An incremental scan of RESP2/RESP3 replies as they stream in: only frame headers are read
//! (a bulk body is counted, never looked at), in constant memory, so the command connection's
//! parser is never handed a frame that would make it wait for, or hold, more than Redis itself
//! could send.

/// Redis's own ceiling for one string (`proto-max-bulk-len` cannot exceed 512 MiB), as the read
/// lane's framer: a longer declared length is no Redis reply.
pub const MAX_BULK_LEN: u64 = 512 * 1024 * 1024;
/// Nesting deeper than any reply the cache asks for (CLUSTER SLOTS and the RESP3 HELLO map are
/// three deep); the parser recurses per level.
pub const MAX_DEPTH: usize = 16;
/// Elements one reply may declare in all (its arrays, maps and sets together): each becomes a
/// value in memory, many times the three bytes it may take on the wire.
pub const MAX_ELEMENTS: u64 = 1 << 24;
/// Bytes one reply may span: one string at the ceiling with room for the rest.
pub const MAX_REPLY_BYTES: u64 = 1 << 30;
/// The longest header or simple line (`+`, `-`, `:` ...): an error text is its longest.
pub const MAX_LINE: usize = 64 * 1024;

/// Why the input cannot be Redis's replies; the connection is closed on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Before a frame's type byte.
    Start,
    /// Inside a header or simple line of type `kind`: `seen` bytes so far; for a length, its
    /// digits read so far (`negative`: a `-` came first); `cr`: the `\r` came.
    Line {
        kind: u8,
        seen: usize,
        number: u64,
        negative: bool,
        digits: bool,
        cr: bool,
    },
    /// Inside a bulk body and its CRLF: bytes still to come.
    Body { left: u64 },
}

/// One open aggregate: elements still to come, and whether it is an attribute (which annotates
/// the value after it and is not an element of its parent).
#[derive(Debug, Clone, Copy)]
struct Open {
    left: u64,
    attribute: bool,
}

/// The scan of one connection's input.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    open: Vec<Open>,
    /// Bytes and declared elements of the reply under way.
    reply_bytes: u64,
    reply_elements: u64,
    /// Replies complete so far (tests count them).
    pub replies: u64,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            state: State::Start,
            open: Vec::with_capacity(MAX_DEPTH),
            reply_bytes: 0,
            reply_elements: 0,
            replies: 0,
        }
    }
}

/// How a frame type's header line is read.
enum Shape {
    /// A length follows, then that many bytes (`$`, `!`, `=`); `nil`: `-1` is allowed.
    Bulk { nil: bool },
    /// A count follows, then that many elements times `per` (`*`, `~`, `>`; `%`, `|`).
    Aggregate { per: u64, nil: bool },
    /// The line is the whole frame (`+`, `-`, `:`, `,`, `(`, `_`, `#`).
    Simple,
}

fn shape(kind: u8) -> Option<Shape> {
    Some(match kind {
        b'$' => Shape::Bulk { nil: true },
        b'!' | b'=' => Shape::Bulk { nil: false },
        b'*' => Shape::Aggregate { per: 1, nil: true },
        b'~' | b'>' => Shape::Aggregate { per: 1, nil: false },
        b'%' | b'|' => Shape::Aggregate { per: 2, nil: false },
        b'+' | b'-' | b':' | b',' | b'(' | b'_' | b'#' => Shape::Simple,
        _ => return None,
    })
}

impl Scanner {
    /// Scans the next bytes of the input; an error is final (the input after it is not read).
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), WireError> {
        while !bytes.is_empty() {
            let used = self.step(bytes)?;
            self.reply_bytes += used as u64;
            if self.reply_bytes > MAX_REPLY_BYTES {
                return Err(WireError("a reply longer than 1 GiB"));
            }
            if matches!(self.state, State::Start) && self.open.is_empty() {
                self.reply_bytes = 0;
                self.reply_elements = 0;
            }
            bytes = &bytes[used..];
        }
        Ok(())
    }

    /// Reads from the front of `bytes` (never empty): how many bytes it used.
    fn step(&mut self, bytes: &[u8]) -> Result<usize, WireError> {
        match self.state {
            State::Start => {
                if shape(bytes[0]).is_none() {
                    return Err(WireError("a byte that starts no RESP frame"));
                }
                self.state = State::Line {
                    kind: bytes[0],
                    seen: 0,
                    number: 0,
                    negative: false,
                    digits: false,
                    cr: false,
                };
                Ok(1)
            }
            State::Body { left } => {
                let take = left.min(bytes.len() as u64);
                if take == left {
                    self.state = State::Start;
                    self.finished();
                } else {
                    self.state = State::Body { left: left - take };
                }
                Ok(take as usize)
            }
            State::Line { .. } => self.line(bytes),
        }
    }

    fn line(&mut self, bytes: &[u8]) -> Result<usize, WireError> {
        let State::Line {
            kind,
            mut seen,
            mut number,
            mut negative,
            mut digits,
            mut cr,
        } = self.state
        else {
            unreachable!("called inside a line")
        };
        let shape = shape(kind).expect("a line's kind has a shape");
        let counted = !matches!(shape, Shape::Simple);
        for (i, &b) in bytes.iter().enumerate() {
            if cr {
                if b != b'\n' {
                    return Err(WireError("a CR not followed by LF"));
                }
                self.end_line(kind, shape, number, negative, digits)?;
                return Ok(i + 1);
            }
            seen += 1;
            if seen > MAX_LINE {
                return Err(WireError("a header or line longer than 64 KiB"));
            }
            if b == b'\r' {
                cr = true;
                continue;
            }
            if !counted {
                if b == b'\n' {
                    return Err(WireError("a LF without CR"));
                }
                continue;
            }
            match b {
                b'-' if seen == 1 => negative = true,
                b'0'..=b'9' => {
                    digits = true;
                    number = number * 10 + u64::from(b - b'0');
                    // Refused as soon as it passes every ceiling, before its line ends.
                    if number > MAX_BULK_LEN.max(MAX_ELEMENTS) {
                        return Err(WireError(too_long(shape)));
                    }
                }
                _ => return Err(WireError("a length that is not a number")),
            }
        }
        self.state = State::Line {
            kind,
            seen,
            number,
            negative,
            digits,
            cr,
        };
        Ok(bytes.len())
    }

    /// A header line ended: what it opens, or the frame it completes.
    fn end_line(
        &mut self,
        kind: u8,
        shape: Shape,
        number: u64,
        negative: bool,
        digits: bool,
    ) -> Result<(), WireError> {
        self.state = State::Start;
        if matches!(shape, Shape::Simple) {
            self.finished();
            return Ok(());
        }
        if !digits {
            return Err(WireError("a length that is not a number"));
        }
        let nil = match shape {
            Shape::Bulk { nil } | Shape::Aggregate { nil, .. } => nil,
            Shape::Simple => false,
        };
        if negative {
            if nil && number == 1 {
                self.finished();
                return Ok(());
            }
            return Err(WireError("a negative length"));
        }
        match shape {
            Shape::Bulk { .. } => {
                if number > MAX_BULK_LEN {
                    return Err(WireError(too_long(shape)));
                }
                self.state = State::Body { left: number + 2 };
            }
            Shape::Aggregate { per, .. } => {
                let elements = number * per;
                self.reply_elements += elements;
                if number > MAX_ELEMENTS || self.reply_elements > MAX_ELEMENTS {
                    return Err(WireError(too_long(shape)));
                }
                if elements == 0 {
                    // An empty attribute annotates the value after it: nothing completes.
                    if kind == b'|' {
                        return Ok(());
                    }
                    self.finished();
                    return Ok(());
                }
                if self.open.len() >= MAX_DEPTH {
                    return Err(WireError("replies nested deeper than 16"));
                }
                self.open.push(Open {
                    left: elements,
                    attribute: kind == b'|',
                });
            }
            Shape::Simple => unreachable!("handled above"),
        }
        Ok(())
    }

    /// A frame is complete: it counts as an element of the aggregate it is in (closing every
    /// aggregate it completes), or it is a whole reply.
    fn finished(&mut self) {
        while let Some(top) = self.open.last_mut() {
            top.left -= 1;
            if top.left > 0 {
                return;
            }
            let closed = self.open.pop().expect("an open aggregate");
            if closed.attribute {
                // The annotated value comes next, as this position's element.
                return;
            }
        }
        self.replies += 1;
    }
}

fn too_long(shape: Shape) -> &'static str {
    match shape {
        Shape::Bulk { .. } => "a declared length over 512 MiB",
        _ => "a reply declaring more than 16M elements",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan(input: &[u8]) -> Result<u64, WireError> {
        let mut s = Scanner::default();
        s.feed(input)?;
        Ok(s.replies)
    }

    #[test]
    fn counts_the_replies_redis_sends() {
        assert_eq!(scan(b"+OK\r\n:12\r\n-ERR no\r\n"), Ok(3));
        assert_eq!(scan(b"$3\r\nabc\r\n$0\r\n\r\n$-1\r\n*-1\r\n"), Ok(4));
        assert_eq!(scan(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"), Ok(1));
        assert_eq!(scan(b"*0\r\n%0\r\n~0\r\n"), Ok(3));
        // A bulk body is counted, not read: CRLFs and type bytes inside it are data.
        assert_eq!(scan(b"$6\r\n*9\r\n$9\r\n"), Ok(1));
        // RESP3: a map, a set, a push, null, boolean, double, big number, verbatim, blob error.
        assert_eq!(
            scan(b"%1\r\n+a\r\n~2\r\n:1\r\n:2\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n"),
            Ok(2)
        );
        assert_eq!(
            scan(b"_\r\n#t\r\n,1.5\r\n(123456789012345678901234567890\r\n=7\r\ntxt:abc\r\n!3\r\nERR\r\n"),
            Ok(6)
        );
        // An attribute annotates the value after it; the two are one reply.
        assert_eq!(scan(b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n"), Ok(1));
        assert_eq!(scan(b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n"), Ok(1));
        assert_eq!(scan(b"|0\r\n:1\r\n"), Ok(1));
        let mut s = Scanner::default();
        s.feed(b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n").unwrap();
        assert_eq!(s.replies, 0, "the array's second element has not come");
    }

    #[test]
    fn a_declared_length_past_redis_ceiling_is_refused_at_its_header() {
        for header in [
            &b"$1000000000000\r\n"[..],
            b"$536870913\r\n",
            b"$9223372036854775807\r\n",
            b"$99999999999999999999999999999\r\n",
            b"!536870913\r\n",
            b"=1000000000000\r\n",
        ] {
            assert!(
                scan(header).is_err(),
                "{:?}",
                String::from_utf8_lossy(header)
            );
            // Before its line even ends.
            assert!(scan(&header[..header.len() - 2]).is_err());
        }
        // At the ceiling: waited for (the body has not come).
        assert_eq!(scan(b"$536870912\r\nabc"), Ok(0));
    }

    #[test]
    fn counts_and_nesting_past_any_reply_we_ask_for_are_refused() {
        assert!(scan(b"*16777217\r\n").is_err());
        assert!(scan(b"%8388609\r\n").is_err());
        assert!(scan(b"*1000000000000\r\n").is_err());
        // Declared in all, across nested arrays.
        let mut s = Scanner::default();
        s.feed(b"*2\r\n*16000000\r\n").unwrap();
        assert!(s.feed(b":1\r\n".repeat(3).as_slice()).is_ok());
        assert!(Scanner::default()
            .feed(b"*2\r\n*16000000\r\n*1000000\r\n")
            .is_err());
        let ok = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert_eq!(scan(ok.as_bytes()), Ok(1));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(scan(deep.as_bytes()).is_err());
        assert!(scan("*1\r\n".repeat(300_000).as_bytes()).is_err());
    }

    #[test]
    fn input_that_is_not_resp_is_refused() {
        for bad in [
            &b"hello\r\n"[..],
            b"$x\r\n",
            b"$-2\r\n",
            b"%-1\r\n",
            b"$\r\n",
            b"$3\nabc",
            b"+OK\rX",
            b"+OK\n",
            b"$?\r\n",
        ] {
            assert!(scan(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(scan(&[b'+'; MAX_LINE + 2]).is_err(), "a line with no end");
        let mut long_error = vec![b'-'];
        long_error.extend(std::iter::repeat_n(b'e', 1000));
        long_error.extend_from_slice(b"\r\n");
        assert_eq!(scan(&long_error), Ok(1));
    }

    /// Cases per property: `FUZZ_CASES` (`npm run fuzz` sets many more), else 2,000.
    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2_000)
    }

    /// One reply as Redis may send it (RESP2 or RESP3), nesting up to `MAX_DEPTH` levels.
    fn reply() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(|v| {
                let mut out = format!("${}\r\n", v.len()).into_bytes();
                out.extend_from_slice(&v);
                out.extend_from_slice(b"\r\n");
                out
            }),
            Just(b"$-1\r\n".to_vec()),
            Just(b"*-1\r\n".to_vec()),
            Just(b"_\r\n".to_vec()),
            Just(b"#f\r\n".to_vec()),
            Just(b",-0.5\r\n".to_vec()),
            any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
            "[a-zA-Z ]{0,40}".prop_map(|e| format!("-ERR {e}\r\n").into_bytes()),
            "[a-zA-Z]{0,10}".prop_map(|e| format!("+{e}\r\n").into_bytes()),
        ];
        leaf.prop_recursive(MAX_DEPTH as u32, 256, 6, |inner| {
            (
                prop_oneof![Just(b'*'), Just(b'~'), Just(b'%')],
                proptest::collection::vec(inner, 0..6),
            )
                .prop_map(|(kind, items)| {
                    let items = if kind == b'%' && items.len() % 2 == 1 {
                        &items[1..]
                    } else {
                        &items[..]
                    };
                    let n = if kind == b'%' {
                        items.len() / 2
                    } else {
                        items.len()
                    };
                    let mut out = format!("{}{n}\r\n", kind as char).into_bytes();
                    for item in items {
                        out.extend_from_slice(item);
                    }
                    out
                })
        })
    }

    /// A reply, or a push frame (top level only, its kind a string first, as Redis sends them).
    fn frame() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => reply(),
            1 => proptest::collection::vec(reply(), 0..4).prop_map(|items| {
                let mut out = format!(">{}\r\n$7\r\nmessage\r\n", items.len() + 1).into_bytes();
                for item in items {
                    out.extend_from_slice(&item);
                }
                out
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Replies Redis sends, back to back, delivered in any cuts: every one passes, each
        /// counted once, and the scan ends between replies.
        #[test]
        fn replies_pass_however_they_are_cut(
            sent in proptest::collection::vec(frame(), 1..6),
            cuts in proptest::collection::vec(0usize..4096, 0..8),
        ) {
            let bytes: Vec<u8> = sent.concat();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut s = Scanner::default();
            let mut at = 0;
            for cut in cuts {
                prop_assert!(s.feed(&bytes[at..cut]).is_ok());
                at = cut;
            }
            prop_assert_eq!(s.replies, sent.len() as u64);
            prop_assert!(matches!(s.state, State::Start) && s.open.is_empty());
        }

        /// Any bytes: passed, or refused; never a panic, and a refusal is never of a prefix
        /// the parser would take whole (what passes in one feed passes in any cuts).
        #[test]
        fn any_bytes_scan_alike_in_any_cuts(
            input in proptest::collection::vec(any::<u8>(), 0..512),
            cut in 0usize..512,
        ) {
            let whole = Scanner::default().feed(&input).is_ok();
            let cut = cut % (input.len() + 1);
            let mut s = Scanner::default();
            let parts = s.feed(&input[..cut]).and_then(|()| s.feed(&input[cut..])).is_ok();
            prop_assert_eq!(whole, parts);
        }

        /// Each reply the scan passes as one whole reply, the redis crate parses without error.
        #[test]
        fn what_passes_the_crate_parses(sent in frame()) {
            prop_assert_eq!(scan(&sent), Ok(1));
            let value = redis::parse_redis_value(&sent);
            prop_assert!(value.is_ok(), "{:?}", value);
        }
    }
}
