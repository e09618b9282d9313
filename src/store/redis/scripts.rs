//! The Lua scripts (`scripts/*.lua`, each naming its KEYS/ARGV), sent by EVALSHA with a load
//! on NOSCRIPT. The envelope's layout (`envelope.lua`) is prepended to the scripts that read it;
//! a tag's record (`tag_record.lua`) and the clock's advance (`advance_of.lua`) to the scripts
//! that share them.

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

/// A script with `envelope.lua`'s functions in front of it.
macro_rules! with_envelope {
    ($path:literal) => {
        Script::new(concat!(
            include_str!("scripts/envelope.lua"),
            include_str!($path)
        ))
    };
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
