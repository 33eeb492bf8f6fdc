//! The five transition scripts, one per state change, each mirroring a
//! function of `store_core::machine`, and the operator's `forget` script,
//! which deletes an unreadable record.
//!
//! Each runs atomically on the server and is called by EVALSHA through
//! [`redis::Script`], which loads it again after a NOSCRIPT error (the script
//! cache empties on restart, failover and `SCRIPT FLUSH`).

use redis::Script;

/// The first line of every script. A shebang switches Redis 7 out of EVAL's
/// compatibility mode; with no `flags=` the script gets the strictest
/// defaults: it may write, so Redis refuses it up front under OOM instead of
/// failing at a write part-way through (`allow-oom` absent); it is refused on
/// a stale replica (`allow-stale` absent); and every key it touches must be in
/// KEYS and in one cluster slot (`allow-cross-slot-keys` absent). `no-writes`
/// must stay absent too, or Redis would refuse the scripts' writes.
pub const SHEBANG: &str = "#!lua";

const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// The compiled scripts, made once per store.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub claim: Script,
    pub checkpoint: Script,
    pub complete: Script,
    pub release: Script,
    pub abandon: Script,
    /// Deletes a record only while it is the one the store judged
    /// unreadable (`scripts/forget.lua`).
    pub forget: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            claim: script(include_str!("scripts/claim.lua")),
            checkpoint: script(include_str!("scripts/checkpoint.lua")),
            complete: script(include_str!("scripts/complete.lua")),
            release: script(include_str!("scripts/release.lua")),
            abandon: script(include_str!("scripts/abandon.lua")),
            forget: script(include_str!("scripts/forget.lua")),
        }
    }

    fn all(&self) -> [&Script; 6] {
        [
            &self.claim,
            &self.checkpoint,
            &self.complete,
            &self.release,
            &self.abandon,
            &self.forget,
        ]
    }

    /// SHA1s of every script, for operators checking `SCRIPT EXISTS`.
    pub fn hashes(&self) -> Vec<String> {
        self.all().iter().map(|script| script.get_hash().to_owned()).collect()
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

fn script(body: &str) -> Script {
    Script::new(&source(body))
}

fn source(body: &str) -> String {
    format!("{SHEBANG}\n{PRELUDE}\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODIES: [&str; 6] = [
        include_str!("scripts/claim.lua"),
        include_str!("scripts/checkpoint.lua"),
        include_str!("scripts/complete.lua"),
        include_str!("scripts/release.lua"),
        include_str!("scripts/abandon.lua"),
        include_str!("scripts/forget.lua"),
    ];

    #[test]
    fn every_script_starts_with_a_shebang_that_keeps_redis_strict() {
        for body in BODIES {
            let code = source(body);
            let first_line = code.lines().next().unwrap_or_default();
            assert!(first_line.starts_with("#!lua"), "{first_line}");
            for lenient in [
                "allow-oom",
                "no-writes",
                "allow-stale",
                "allow-cross-slot-keys",
                "no-cluster",
            ] {
                assert!(!first_line.contains(lenient), "{first_line} has {lenient}");
            }
        }
    }

    #[test]
    fn scripts_read_the_clock_with_time_and_name_keys_only_through_keys() {
        for body in BODIES.iter().chain([&PRELUDE]) {
            assert!(!body.contains("ARGV[0]"));
            // Every redis.call names its key as KEYS[i]; a computed key name
            // would break on Redis Cluster.
            for line in body.lines().filter(|line| line.contains("redis.call(")) {
                let names_a_key = line.contains("KEYS[") || line.contains(", key") || line.contains("'TIME'");
                // A publish names a channel, not a key: the record's own
                // channel, which carries the record's hash tag (notify.rs),
                // so SPUBLISH stays in the script's slot on Cluster.
                let publishes_the_change = line.contains("PUBLISH', ARGV[count], 'changed')");
                assert!(names_a_key || publishes_the_change, "{line}");
            }
        }
        assert!(PRELUDE.contains("redis.call('TIME')"));
    }

    #[test]
    fn the_scripts_are_distinct() {
        let hashes = Scripts::new().hashes();
        let mut unique = hashes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), hashes.len());
    }
}
