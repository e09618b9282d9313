//! The Lua scripts (`scripts/*.lua`, each naming its KEYS/ARGV), sent by EVALSHA with a load
//! on NOSCRIPT. The envelope's layout (`envelope.lua`, those of its functions a script calls)
//! goes in front of the scripts that read it; a tag's record (`tag_record.lua`) and the clock's
//! advance (`advance_of.lua`) in front of the scripts that share them.

use redis::Script;

/// The code of `echo.lua` (its comment lines left out, as they would travel with every call):
/// sent by EVAL with its text, so it never meets NOSCRIPT (see the script).
pub(super) static ECHO: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    include_str!("scripts/echo.lua")
        .lines()
        .filter(|line| !line.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
});

/// A script with `envelope.lua` in front of it: its constants, and those of its functions the
/// script calls (or a function it keeps calls). Every call of a script defines its functions
/// again, and each definition costs Redis (`bench/redis-cost.js --instructions`: the whole file
/// is about 12.8k instructions a call, the functions the cold gate does not call 5.1k of them).
macro_rules! with_envelope {
    ($path:literal) => {
        Script::new(&envelope_for(include_str!($path)))
    };
}

/// `envelope.lua` as [`with_envelope!`] puts it in front of `body`, then `body`. The file's
/// shape is what this reads: each function begins with a line `local function name(` and ends
/// with a line `end`; every other line is kept.
fn envelope_for(body: &str) -> String {
    let file = include_str!("scripts/envelope.lua");
    // (name, text) of each function, in the file's order; `None` for the lines between them.
    let mut parts: Vec<(Option<&str>, String)> = Vec::new();
    let mut inside = false;
    for line in file.lines() {
        if let Some(rest) = line.strip_prefix("local function ") {
            let name = rest.split('(').next().unwrap_or(rest);
            parts.push((Some(name), String::new()));
            inside = true;
        } else if !inside && !matches!(parts.last(), Some((None, _))) {
            parts.push((None, String::new()));
        }
        let text = &mut parts.last_mut().expect("a part was pushed").1;
        text.push_str(line);
        text.push('\n');
        if inside && line == "end" {
            inside = false;
        }
    }
    let calls = |text: &str, name: &str| {
        let call = format!("{name}(");
        text.match_indices(&call).any(|(at, _)| {
            // Not a longer name ending in this one, nor its own definition.
            let before = text[..at].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !text[..at].ends_with("local function ")
        })
    };
    let mut kept = vec![false; parts.len()];
    loop {
        let mut grew = false;
        for i in 0..parts.len() {
            let Some(name) = parts[i].0 else { continue };
            if kept[i] {
                continue;
            }
            let called = calls(body, name)
                || parts
                    .iter()
                    .zip(&kept)
                    .any(|((_, text), &k)| k && calls(text, name));
            if called {
                kept[i] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let mut out = String::with_capacity(file.len() + body.len());
    for ((name, text), keep) in parts.iter().zip(kept) {
        if name.is_none() || keep {
            out.push_str(text);
        }
    }
    out.push_str(body);
    out
}

/// One of each script, hashed once for the tier.
pub struct Scripts {
    pub(super) fence: Script,
    pub(super) cold_gate: Script,
    pub(super) refresh_gate: Script,
    pub(super) write_back: Script,
    pub(super) write: Script,
    pub(super) release: Script,
    pub(super) replace: Script,
    pub(super) tag: Script,
    pub(super) clear: Script,
    pub(super) sweep: Script,
    pub(super) reborn: Script,
    pub(super) advance: Script,
    pub(super) tags: Script,
    pub(super) expire: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Scripts {
            fence: with_envelope!("scripts/fence.lua"),
            cold_gate: with_envelope!("scripts/cold_gate.lua"),
            refresh_gate: with_envelope!("scripts/refresh_gate.lua"),
            write_back: with_envelope!("scripts/write_back.lua"),
            write: with_envelope!("scripts/write.lua"),
            release: with_envelope!("scripts/release.lua"),
            replace: Script::new(include_str!("scripts/replace.lua")),
            tag: Script::new(concat!(
                include_str!("scripts/tag_record.lua"),
                include_str!("scripts/tag.lua")
            )),
            tags: Script::new(concat!(
                include_str!("scripts/advance_of.lua"),
                include_str!("scripts/tag_record.lua"),
                include_str!("scripts/tags.lua")
            )),
            expire: with_envelope!("scripts/expire.lua"),
            clear: Script::new(include_str!("scripts/clear.lua")),
            sweep: with_envelope!("scripts/sweep.lua"),
            reborn: with_envelope!("scripts/reborn.lua"),
            advance: Script::new(concat!(
                include_str!("scripts/advance_of.lua"),
                include_str!("scripts/advance.lua")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::envelope_for;

    /// The functions `envelope.lua` defines.
    fn functions() -> Vec<&'static str> {
        include_str!("scripts/envelope.lua")
            .lines()
            .filter_map(|l| l.strip_prefix("local function "))
            .filter_map(|rest| rest.split('(').next())
            .collect()
    }

    fn defines(text: &str, name: &str) -> bool {
        text.contains(&format!("local function {name}("))
    }

    #[test]
    fn a_script_carries_the_functions_it_calls_and_theirs_and_no_other() {
        let write_back = envelope_for(include_str!("scripts/write_back.lua"));
        for name in [
            "envelope_generation",
            "envelope_carrying",
            "envelope_marker",
            "envelope_waited",
            // Called by those.
            "envelope_binary",
            "envelope_magic",
            "envelope_made_at",
        ] {
            assert!(defines(&write_back, name), "{name}");
        }
        for name in ["envelope_fence", "envelope_expired", "envelope_as_expected"] {
            assert!(!defines(&write_back, name), "{name}");
        }
        assert!(write_back.contains("local ENVELOPE_TIMED_FIXED = 46"));
        assert!(write_back.ends_with(include_str!("scripts/write_back.lua")));
    }

    #[test]
    fn write_back_knows_a_carried_announcement_by_the_byte_the_bus_gives_it() {
        let byte = super::super::carried::CARRIED_MESSAGE;
        assert!(include_str!("scripts/write_back.lua")
            .contains(&format!("local CARRIED_MESSAGE = {byte}\n")));
    }

    #[test]
    fn every_function_a_script_calls_is_defined_before_it_in_that_script() {
        for (name, body) in [
            ("fence", include_str!("scripts/fence.lua")),
            ("cold_gate", include_str!("scripts/cold_gate.lua")),
            ("refresh_gate", include_str!("scripts/refresh_gate.lua")),
            ("write_back", include_str!("scripts/write_back.lua")),
            ("write", include_str!("scripts/write.lua")),
            ("release", include_str!("scripts/release.lua")),
            ("expire", include_str!("scripts/expire.lua")),
            ("sweep", include_str!("scripts/sweep.lua")),
            ("reborn", include_str!("scripts/reborn.lua")),
        ] {
            let text = envelope_for(body);
            for f in functions() {
                let call = format!("{f}(");
                let defined_at = text.find(&format!("local function {f}("));
                for (at, _) in text.match_indices(&call) {
                    if text[..at].ends_with("local function ") {
                        continue;
                    }
                    let before = text[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    assert!(
                        defined_at.is_some_and(|d| d < at),
                        "{name}: {f} is called at {at} but not defined before it"
                    );
                }
            }
        }
    }
}
