//! Whether a value text read from Redis stands for exactly one element when a batch joins the
//! texts of its keys into one JSON array (`[a,b,...]`, parsed by one `JSON.parse` on the JS
//! thread: src/node/batch.rs). An envelope's value is not parsed when it is read, so a corrupt
//! or hostile one (`1,2`, or `[1` beside `2]`) could otherwise stand for two elements, or join
//! its neighbour, and move every value after it to another key. With this check a text that
//! could do so keeps the batch from being joined at all (each text is then read apart).

/// `text` can only be read as one element of a JSON array it is joined into with `,`: it is
/// not blank (`[ ]` holds no element), its brackets balance (outside strings), its strings
/// close, and it has no `,` or `:` of its own at the top. It may still be invalid JSON (`{]`): then the joined array fails to parse as a
/// whole, which the reader handles by reading each text apart.
///
/// One table look-up a byte (`CLASS`), strings walked in a loop of their own: the first form,
/// a `match` on every byte with the string state beside it, took 2.5 to 3.5 times as long
/// (about 400 µs for the texts of a warm batch of 1,000 keys), a tenth of the binding's time.
pub fn one_element(text: &str) -> bool {
    let b = text.as_bytes();
    if b.trim_ascii().is_empty() {
        return false;
    }
    let n = b.len();
    let mut depth = 0usize;
    let mut i = 0;
    while i < n {
        match CLASS[b[i] as usize] {
            PLAIN => {}
            QUOTE => {
                // To the string's closing quote; the byte after a backslash never ends it.
                i += 1;
                loop {
                    let Some(&c) = b.get(i) else {
                        return false;
                    };
                    if c == b'"' {
                        break;
                    }
                    i += if c == b'\\' { 2 } else { 1 };
                }
            }
            OPEN => depth += 1,
            CLOSE => {
                if depth == 0 {
                    return false;
                }
                depth -= 1;
            }
            _ => {
                // `,` or `:`: of its own only at the top.
                if depth == 0 {
                    return false;
                }
            }
        }
        i += 1;
    }
    depth == 0
}

const PLAIN: u8 = 0;
const QUOTE: u8 = 1;
const OPEN: u8 = 2;
const CLOSE: u8 = 3;
const SEPARATOR: u8 = 4;

/// What each byte is to `one_element` outside strings.
static CLASS: [u8; 256] = {
    let mut t = [PLAIN; 256];
    t[b'"' as usize] = QUOTE;
    t[b'[' as usize] = OPEN;
    t[b'{' as usize] = OPEN;
    t[b']' as usize] = CLOSE;
    t[b'}' as usize] = CLOSE;
    t[b',' as usize] = SEPARATOR;
    t[b':' as usize] = SEPARATOR;
    t
};

#[cfg(test)]
mod tests {
    use super::one_element;

    /// The check as it was first written, a byte at a time: the oracle the fast one must agree
    /// with on every input.
    fn walked(text: &str) -> bool {
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        if text.is_empty() {
            return false;
        }
        for &b in text.as_bytes() {
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => depth += 1,
                b']' | b'}' => {
                    if depth == 0 {
                        return false;
                    }
                    depth -= 1;
                }
                b',' | b':' if depth == 0 => return false,
                _ => {}
            }
        }
        depth == 0 && !in_string
    }

    #[test]
    fn one_element_texts_pass_and_the_others_do_not() {
        for ok in [
            r#"{"id":1,"name":"User 1","tags":["a","b"]}"#,
            "[1,2,3]",
            "1",
            "null",
            r#""a,b:c]""#,
            r#""quote \" inside""#,
            r#""ends in a backslash \\""#,
            r#"{"k":"\\\"]"}"#,
            "{]",
        ] {
            assert!(one_element(ok), "{ok}");
            assert!(walked(ok), "{ok}");
        }
        for bad in [" ", "\n\t"] {
            assert!(!one_element(bad), "{bad:?}");
        }
        for bad in [
            "",
            "1,2",
            "1:2",
            "[1",
            "2]",
            "}",
            r#""open"#,
            r#""escaped end \""#,
            r#""\"#,
            r#"{"a":"b}"#,
            r#"[1],[2]"#,
        ] {
            assert!(!one_element(bad), "{bad}");
            assert!(!walked(bad), "{bad}");
        }
    }

    /// Cases per property: `FUZZ_CASES` (`npm run fuzz` sets many more), else 20,000.
    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000)
    }

    /// Texts of JSON's structural bytes and a few others, where every edge of the check lies.
    fn structural() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex(r#"[\[\]{}",:\\a1 é]{0,24}"#).unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(cases()))]

        /// The fast check says what the byte walk says, on any text.
        #[test]
        fn one_element_agrees_with_the_byte_walk(text in structural()) {
            let blank = text.trim_ascii().is_empty();
            proptest::prop_assert_eq!(one_element(&text), walked(&text) && !blank);
        }

        /// Texts that pass, joined into one array: if it parses, it holds one element per text,
        /// each the text's own value, so no value moves to another key.
        #[test]
        fn joined_texts_that_pass_parse_one_element_each(
            texts in proptest::collection::vec(
                proptest::prop_oneof![
                    structural(),
                    proptest::prelude::Just(r#"{"a":[1,"x,]"]}"#.to_string()),
                    proptest::prelude::Just("[1".to_string()),
                    proptest::prelude::Just("2]".to_string()),
                    proptest::prelude::Just("3,4".to_string()),
                    proptest::prelude::Just(r#""s""#.to_string()),
                    proptest::prelude::Just("7".to_string()),
                ],
                1..6,
            )
        ) {
            let texts: Vec<String> = texts.into_iter().filter(|t| one_element(t)).collect();
            let joined = format!("[{}]", texts.join(","));
            if let Ok(serde_json::Value::Array(items)) = serde_json::from_str::<serde_json::Value>(&joined) {
                proptest::prop_assert_eq!(items.len(), texts.len());
                for (item, text) in items.iter().zip(&texts) {
                    let own: serde_json::Value = serde_json::from_str(text).expect("an element parses alone");
                    proptest::prop_assert_eq!(item, &own);
                }
            }
        }
    }
}
