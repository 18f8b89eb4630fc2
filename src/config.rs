//! Runtime configuration and the environment variables that set defaults.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::device::Backend;
use crate::error::ResourceError;

/// Which allocator sits at the bottom of the stack.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AllocatorKind {
    /// Stream-ordered allocation with block-use tracking (the default).
    Async,
    /// Synchronous allocation, no tracking.
    Direct,
}

pub const DEFAULT_STREAM_POOL_SIZE: u32 = 16;
pub const DEFAULT_SIM_CAPACITY: u64 = 1 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub backend: Backend,
    pub allocator: AllocatorKind,
    /// 0 = no budget layer.
    pub budget_bytes: u64,
    pub stream_pool_size: u32,
    /// None = no log.
    pub log_path: Option<PathBuf>,
    pub sim_capacity_bytes: u64,
    pub wait_on_pressure: bool,
    /// Cache freed blocks per stream (async allocator only; DESIGN.md
    /// "Stream-ordered caching"). Off restores free-to-driver.
    pub cache: bool,
    /// Where the async allocator's memory comes from (`XLOG_MEMORY`):
    /// xlog's own arena on the virtual-memory API (`arena`, the default,
    /// where the device supports it) or the driver's stream-ordered pool
    /// (`pool`). DESIGN.md "Physical memory".
    pub arena: bool,
    /// Bytes of freed memory xlog's driver pool keeps mapped at
    /// synchronisation points; `u64::MAX` keeps all (the default: the
    /// budget and `trim` bound it).
    pub pool_release_threshold: u64,
    /// Record the call site of every allocation for the live-block list
    /// (`telemetry`); off by default, so the hot path pays nothing.
    pub track_call_sites: bool,
    /// Devices the sim backend simulates (`XLOG_SIM_DEVICES`, default 1):
    /// opening a sim ordinal at or past it fails with `NoDevice`
    /// (`device/sim_platform.rs`). Ignored by the CUDA backend.
    pub sim_devices: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: Backend::Auto,
            allocator: AllocatorKind::Async,
            budget_bytes: 0,
            stream_pool_size: DEFAULT_STREAM_POOL_SIZE,
            log_path: None,
            sim_capacity_bytes: DEFAULT_SIM_CAPACITY,
            wait_on_pressure: false,
            cache: true,
            arena: true,
            pool_release_threshold: u64::MAX,
            track_call_sites: false,
            sim_devices: crate::device::sim_platform::DEFAULT_SIM_DEVICES,
        }
    }
}

impl Config {
    /// Defaults overridden by `XLOG_BACKEND`, `XLOG_BUDGET_BYTES`,
    /// `XLOG_LOG_PATH`, `XLOG_CACHE`, `XLOG_MEMORY`, `XLOG_POOL_RELEASE_THRESHOLD`,
    /// `XLOG_TRACK_CALLSITES` and `XLOG_SIM_DEVICES`. A malformed value is an
    /// error naming the variable and the value, never a silent default.
    pub fn from_env() -> Result<Config, ResourceError> {
        let mut cfg = Config::default();
        cfg.apply_env(|name| std::env::var_os(name))?;
        Ok(cfg)
    }

    /// `apply_env` with an injectable lookup, so tests need not touch the
    /// process environment. Values are taken as the OS gives them: a
    /// `XLOG_BACKEND` or `XLOG_BUDGET_BYTES` that is not UTF-8 is malformed
    /// (an error, not "unset"); `XLOG_LOG_PATH` is a file name, and any
    /// bytes make one (as for `xlog_config.log_path`), so it is used as is.
    pub fn apply_env<V: Into<OsString>>(&mut self, get: impl Fn(&str) -> Option<V>) -> Result<(), ResourceError> {
        if let Some(v) = get("XLOG_BACKEND") {
            let v = utf8_value("XLOG_BACKEND", v.into())?;
            self.backend = parse_backend(&v).map_err(|m| env_error("XLOG_BACKEND", &v, &m))?;
        }
        if let Some(v) = get("XLOG_BUDGET_BYTES") {
            let v = utf8_value("XLOG_BUDGET_BYTES", v.into())?;
            self.budget_bytes = parse_size(&v).map_err(|m| env_error("XLOG_BUDGET_BYTES", &v, &m))?;
        }
        if let Some(v) = get("XLOG_LOG_PATH") {
            let v: OsString = v.into();
            self.log_path = if v.is_empty() { None } else { Some(PathBuf::from(v)) };
        }
        if let Some(v) = get("XLOG_CACHE") {
            let v = utf8_value("XLOG_CACHE", v.into())?;
            self.cache = match v.trim() {
                "1" => true,
                "0" => false,
                _ => return Err(env_error("XLOG_CACHE", &v, "expected 0 or 1")),
            };
        }
        if let Some(v) = get("XLOG_MEMORY") {
            let v = utf8_value("XLOG_MEMORY", v.into())?;
            self.arena = match v.trim() {
                "arena" => true,
                "pool" => false,
                _ => return Err(env_error("XLOG_MEMORY", &v, "expected arena or pool")),
            };
        }
        if let Some(v) = get("XLOG_TRACK_CALLSITES") {
            let v = utf8_value("XLOG_TRACK_CALLSITES", v.into())?;
            self.track_call_sites = match v.trim() {
                "1" => true,
                "0" | "" => false,
                _ => return Err(env_error("XLOG_TRACK_CALLSITES", &v, "expected 0 or 1")),
            };
        }
        if let Some(v) = get("XLOG_POOL_RELEASE_THRESHOLD") {
            let v = utf8_value("XLOG_POOL_RELEASE_THRESHOLD", v.into())?;
            self.pool_release_threshold =
                parse_threshold(&v).map_err(|m| env_error("XLOG_POOL_RELEASE_THRESHOLD", &v, &m))?;
        }
        if let Some(v) = get("XLOG_SIM_DEVICES") {
            let v = utf8_value("XLOG_SIM_DEVICES", v.into())?;
            self.sim_devices = parse_sim_devices(&v).map_err(|m| env_error("XLOG_SIM_DEVICES", &v, &m))?;
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ResourceError> {
        if self.stream_pool_size == 0 {
            return Err(ResourceError::InvalidArgument("stream_pool_size must be at least 1".into()));
        }
        if self.backend != Backend::Cuda && self.sim_capacity_bytes == 0 {
            return Err(ResourceError::InvalidArgument("sim_capacity_bytes must be at least 1".into()));
        }
        let max_devices = crate::device::sim_platform::MAX_SIM_DEVICES;
        if self.backend != Backend::Cuda && (self.sim_devices == 0 || self.sim_devices > max_devices) {
            return Err(ResourceError::InvalidArgument(format!(
                "sim_devices is {} (must be 1..={max_devices})",
                self.sim_devices
            )));
        }
        Ok(())
    }
}

/// A sim device count: a whole number in 1..=MAX_SIM_DEVICES.
pub fn parse_sim_devices(text: &str) -> Result<u32, String> {
    let max = crate::device::sim_platform::MAX_SIM_DEVICES;
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a device count from 1 to {max}")),
    }
}

fn env_error(name: &str, value: &str, why: &str) -> ResourceError {
    ResourceError::InvalidArgument(format!("environment variable {name}={value:?} is malformed: {why}"))
}

/// The value of a variable that must be text.
fn utf8_value(name: &str, value: OsString) -> Result<String, ResourceError> {
    value.into_string().map_err(|raw| {
        ResourceError::InvalidArgument(format!(
            "environment variable {name}={raw:?} is malformed: it is not valid UTF-8"
        ))
    })
}

pub fn parse_backend(text: &str) -> Result<Backend, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" | "" => Ok(Backend::Auto),
        "cuda" | "gpu" => Ok(Backend::Cuda),
        "sim" => Ok(Backend::Sim),
        _ => Err("expected one of auto, cuda, sim".into()),
    }
}

/// A release threshold: `max` (keep all freed memory mapped) or a size.
pub fn parse_threshold(text: &str) -> Result<u64, String> {
    if text.trim().eq_ignore_ascii_case("max") {
        return Ok(u64::MAX);
    }
    parse_size(text).map_err(|m| format!("{m}, or max"))
}

/// Parse a byte count: a plain integer, or a number with a unit — `B`,
/// `KB`/`MB`/`GB`/`TB` (powers of 1000), `KiB`/`MiB`/`GiB`/`TiB` (powers of
/// 1024), or the one-letter `K`/`M`/`G`/`T` (taken as powers of 1024).
/// Fractions are allowed with a unit (`1.5GiB`) when the result is a whole
/// number of bytes. The value is computed exactly, in integers: nothing is
/// rounded (`9007199254740993.0` is 9007199254740993 bytes); a value that
/// does not fit in 64 bits, or a fraction of more than 38 digits, is an
/// error.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    if number.is_empty() {
        return Err("expected a number of bytes such as 536870912, 512MiB or 8GiB".into());
    }
    // Every unit is 2^twos * 5^fives.
    let (twos, fives): (u32, u32) = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => (0, 0),
        "kb" => (3, 3),
        "mb" => (6, 6),
        "gb" => (9, 9),
        "tb" => (12, 12),
        "k" | "kib" => (10, 0),
        "m" | "mib" => (20, 0),
        "g" | "gib" => (30, 0),
        "t" | "tib" => (40, 0),
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(format!("{number:?} is not a number"));
    }
    let too_big = || "value does not fit in 64 bits".to_string();
    let multiplier = 2u128.pow(twos) * 5u128.pow(fives);

    // The whole part: more than 20 significant digits is past u64::MAX.
    let whole_digits = whole.trim_start_matches('0');
    if whole_digits.len() > 20 {
        return Err(too_big());
    }
    let whole_value: u128 = if whole_digits.is_empty() { 0 } else { whole_digits.parse().map_err(|_| too_big())? };
    let mut bytes = whole_value * multiplier;

    // The fraction f / 10^k (trailing zeros change nothing) times
    // 2^twos * 5^fives is whole exactly when f supplies the 2s and 5s the
    // unit lacks: 2^(k - twos) and 5^(k - fives) must divide f.
    let fraction_digits = fraction.trim_end_matches('0');
    if !fraction_digits.is_empty() {
        if fraction_digits.len() > 38 {
            return Err(format!("{text:?} has more than 38 fractional digits"));
        }
        let k = fraction_digits.len() as u32;
        let f: u128 = fraction_digits.parse().map_err(|_| format!("{number:?} is not a number"))?;
        let (need_twos, need_fives) = (k.saturating_sub(twos), k.saturating_sub(fives));
        let divisor = 2u128.checked_pow(need_twos).zip(5u128.checked_pow(need_fives)).and_then(|(a, b)| a.checked_mul(b));
        let whole_bytes = match divisor {
            Some(d) if f % d == 0 => f / d,
            _ => return Err(format!("{text:?} is not a whole number of bytes")),
        };
        let rest = 2u128.pow(twos.saturating_sub(k)) * 5u128.pow(fives.saturating_sub(k));
        bytes = whole_bytes.checked_mul(rest).and_then(|b| b.checked_add(bytes)).ok_or_else(too_big)?;
    }
    u64::try_from(bytes).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_devices_come_from_the_environment_and_are_checked() {
        let mut cfg = Config::default();
        assert_eq!(cfg.sim_devices, 1, "one sim device unless asked");
        cfg.apply_env(|name| (name == "XLOG_SIM_DEVICES").then_some(" 3 ")).unwrap();
        assert_eq!(cfg.sim_devices, 3);
        for bad in ["0", "two", "-1", "65537", ""] {
            let err = Config::default().apply_env(|name| (name == "XLOG_SIM_DEVICES").then_some(bad)).unwrap_err();
            assert!(err.to_string().contains("XLOG_SIM_DEVICES"), "{bad:?}: {err}");
        }
        let zero = Config { backend: Backend::Sim, sim_devices: 0, ..Config::default() };
        assert!(zero.validate().unwrap_err().to_string().contains("sim_devices is 0"));
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 4096 "), Ok(4096));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("64k"), Ok(65536));
    }

    #[test]
    fn malformed_sizes_are_errors() {
        for bad in ["", "abc", "12xyz", "-5", "1.2.3GiB", "99999999999999999999", "20000000TiB", "0.3B", ".", "1e3"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn sizes_parse_exactly_without_rounding() {
        // Past 2^53 a double cannot hold every integer: these used to round.
        assert_eq!(parse_size("9007199254740993.0"), Ok(9_007_199_254_740_993));
        assert_eq!(parse_size("9007199254740993.000B"), Ok(9_007_199_254_740_993));
        assert_eq!(parse_size("18446744073709551615.0"), Ok(u64::MAX));
        assert!(parse_size("18446744073709551616.0").is_err(), "one past u64::MAX");
        assert!(parse_size("18446744073709551615.5").is_err(), "a half byte");
        assert_eq!(parse_size("8589934591.999999999068677425384521484375GiB"), Ok(u64::MAX / 2), "2^63 - 2^30 + (2^30 - 1)");
        // Exact fractions of binary and decimal units, long and short.
        assert_eq!(parse_size("0.5KiB"), Ok(512));
        assert_eq!(parse_size(".25MiB"), Ok(1 << 18));
        assert_eq!(parse_size("1.000000001GB"), Ok(1_000_000_001));
        assert_eq!(parse_size("0.000000000931322574615478515625GiB"), Ok(1), "2^-30 GiB is one byte");
        assert_eq!(parse_size("16777216.00000006TB"), Ok(16_777_216_000_000_060_000));
        assert!(parse_size("0.0000000009313225746154785156GiB").is_err(), "just short of one byte");
        assert!(parse_size("1.0000000001GB").is_err(), "a tenth of a byte");
        assert!(parse_size("1.000000000000000000000000000000000000001").is_err(), "39 fractional digits");
        assert_eq!(parse_size("1.5000000000000000000000000000000000000000000000000000GiB"), Ok(3 << 29), "trailing zeros are free");
    }

    #[test]
    fn non_utf8_environment_values_are_errors_or_used_as_paths() {
        use std::os::unix::ffi::OsStringExt;
        let raw = || std::ffi::OsString::from_vec(vec![b'1', 0xff, b'G']);
        for name in ["XLOG_BACKEND", "XLOG_BUDGET_BYTES"] {
            let mut cfg = Config::default();
            let err = cfg.apply_env(|n| (n == name).then(raw)).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(name) && msg.contains("not valid UTF-8"), "{msg}");
            assert_eq!(cfg, Config::default(), "a refused value changes nothing");
        }
        // A file name may be any bytes (as in xlog_config.log_path).
        let mut cfg = Config::default();
        cfg.apply_env(|n| (n == "XLOG_LOG_PATH").then(raw)).unwrap();
        assert_eq!(cfg.log_path.map(|p| p.into_os_string()), Some(raw()));
    }

    #[test]
    fn env_overrides_defaults_and_reports_bad_values() {
        let mut cfg = Config::default();
        cfg.apply_env(|n| match n {
            "XLOG_BACKEND" => Some("sim"),
            "XLOG_BUDGET_BYTES" => Some("1GiB"),
            "XLOG_LOG_PATH" => Some("/tmp/x.csv"),
            _ => None,
        })
        .unwrap();
        assert_eq!(cfg.backend, Backend::Sim);
        assert_eq!(cfg.budget_bytes, 1 << 30);
        assert_eq!(cfg.log_path, Some(PathBuf::from("/tmp/x.csv")));
        let err = Config::default()
            .apply_env(|n| (n == "XLOG_BUDGET_BYTES").then(|| "lots".to_string()))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("XLOG_BUDGET_BYTES") && msg.contains("lots"), "{msg}");
        let err = Config::default().apply_env(|n| (n == "XLOG_BACKEND").then_some("tpu")).unwrap_err();
        assert!(err.to_string().contains("tpu"));
    }

    #[test]
    fn cache_and_release_threshold_from_env() {
        let mut cfg = Config::default();
        assert!(cfg.cache, "the cache is on by default");
        assert_eq!(cfg.pool_release_threshold, u64::MAX, "the pool keeps its memory by default");
        cfg.apply_env(|n| match n {
            "XLOG_CACHE" => Some("0".to_string()),
            "XLOG_POOL_RELEASE_THRESHOLD" => Some("256MiB".to_string()),
            "XLOG_MEMORY" => Some("pool".to_string()),
            _ => None,
        })
        .unwrap();
        assert!(!cfg.cache);
        assert!(!cfg.arena);
        assert_eq!(cfg.pool_release_threshold, 256 << 20);
        cfg.apply_env(|n| (n == "XLOG_POOL_RELEASE_THRESHOLD").then(|| "MAX".to_string())).unwrap();
        assert_eq!(cfg.pool_release_threshold, u64::MAX);
        for (name, bad) in [("XLOG_CACHE", "yes"), ("XLOG_CACHE", "2"), ("XLOG_MEMORY", "vmm"), ("XLOG_POOL_RELEASE_THRESHOLD", "lots")] {
            let err = Config::default().apply_env(|n| (n == name).then(|| bad.to_string())).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(name) && msg.contains(bad), "{msg}");
        }
    }
}
