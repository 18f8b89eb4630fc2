//! Runtime configuration and the environment variables that set defaults.

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
    /// None = no logging layer.
    pub log_path: Option<PathBuf>,
    pub sim_capacity_bytes: u64,
    pub wait_on_pressure: bool,
    /// Cache freed blocks per stream (async allocator only; DESIGN.md
    /// "Stream-ordered caching"). Off restores free-to-driver.
    pub cache: bool,
    /// Bytes of freed memory xlog's driver pool keeps mapped at
    /// synchronisation points; `u64::MAX` keeps all (the default: the
    /// budget and `trim` bound it).
    pub pool_release_threshold: u64,
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
            pool_release_threshold: u64::MAX,
        }
    }
}

impl Config {
    /// Defaults overridden by `XLOG_BACKEND`, `XLOG_BUDGET_BYTES`,
    /// `XLOG_LOG_PATH`, `XLOG_CACHE` and `XLOG_POOL_RELEASE_THRESHOLD`. A malformed value is an error naming the variable
    /// and the value, never a silent default.
    pub fn from_env() -> Result<Config, ResourceError> {
        let mut cfg = Config::default();
        cfg.apply_env(|name| std::env::var(name).ok())?;
        Ok(cfg)
    }

    /// `apply_env` with an injectable lookup, so tests need not touch the
    /// process environment.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ResourceError> {
        if let Some(v) = get("XLOG_BACKEND") {
            self.backend = parse_backend(&v).map_err(|m| env_error("XLOG_BACKEND", &v, &m))?;
        }
        if let Some(v) = get("XLOG_BUDGET_BYTES") {
            self.budget_bytes = parse_size(&v).map_err(|m| env_error("XLOG_BUDGET_BYTES", &v, &m))?;
        }
        if let Some(v) = get("XLOG_LOG_PATH") {
            self.log_path = if v.is_empty() { None } else { Some(PathBuf::from(v)) };
        }
        if let Some(v) = get("XLOG_CACHE") {
            self.cache = match v.trim() {
                "1" => true,
                "0" => false,
                _ => return Err(env_error("XLOG_CACHE", &v, "expected 0 or 1")),
            };
        }
        if let Some(v) = get("XLOG_POOL_RELEASE_THRESHOLD") {
            self.pool_release_threshold =
                parse_threshold(&v).map_err(|m| env_error("XLOG_POOL_RELEASE_THRESHOLD", &v, &m))?;
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
        Ok(())
    }
}

fn env_error(name: &str, value: &str, why: &str) -> ResourceError {
    ResourceError::InvalidArgument(format!("environment variable {name}={value:?} is malformed: {why}"))
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
/// Fractions are allowed with a unit (`1.5GiB`); overflow is an error.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    if number.is_empty() {
        return Err("expected a number of bytes such as 536870912, 512MiB or 8GiB".into());
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(|| "value does not fit in 64 bits".to_string());
    }
    let value: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("value does not fit in 64 bits".into());
    }
    if bytes.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in ["", "abc", "12xyz", "-5", "1.2.3GiB", "99999999999999999999", "20000000TiB", "0.3B"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn env_overrides_defaults_and_reports_bad_values() {
        let mut cfg = Config::default();
        cfg.apply_env(|n| match n {
            "XLOG_BACKEND" => Some("sim".into()),
            "XLOG_BUDGET_BYTES" => Some("1GiB".into()),
            "XLOG_LOG_PATH" => Some("/tmp/x.csv".into()),
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
        let err = Config::default().apply_env(|n| (n == "XLOG_BACKEND").then(|| "tpu".into())).unwrap_err();
        assert!(err.to_string().contains("tpu"));
    }

    #[test]
    fn cache_and_release_threshold_from_env() {
        let mut cfg = Config::default();
        assert!(cfg.cache, "the cache is on by default");
        assert_eq!(cfg.pool_release_threshold, u64::MAX, "the pool keeps its memory by default");
        cfg.apply_env(|n| match n {
            "XLOG_CACHE" => Some("0".into()),
            "XLOG_POOL_RELEASE_THRESHOLD" => Some("256MiB".into()),
            _ => None,
        })
        .unwrap();
        assert!(!cfg.cache);
        assert_eq!(cfg.pool_release_threshold, 256 << 20);
        cfg.apply_env(|n| (n == "XLOG_POOL_RELEASE_THRESHOLD").then(|| "MAX".into())).unwrap();
        assert_eq!(cfg.pool_release_threshold, u64::MAX);
        for (name, bad) in [("XLOG_CACHE", "yes"), ("XLOG_CACHE", "2"), ("XLOG_POOL_RELEASE_THRESHOLD", "lots")] {
            let err = Config::default().apply_env(|n| (n == name).then(|| bad.to_string())).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(name) && msg.contains(bad), "{msg}");
        }
    }
}
