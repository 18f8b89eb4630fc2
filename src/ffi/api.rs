//! Every production entry point in one namespace, for Rust callers (the
//! tests, benches and fuzz targets call the C functions directly). The
//! functions themselves live one concept per file beside this one
//! (`library`, `config`, `runtime`, `stats`, `stream`, `block`, `launch`,
//! `capture`, `reclaim`, `inspect`); the framework hooks are in `interop`,
//! the test entry points in `testing`.

pub use super::block::*;
pub use super::capture::*;
pub use super::config::*;
pub use super::inspect::*;
pub use super::launch::*;
pub use super::library::*;
pub use super::reclaim::*;
pub use super::runtime::*;
pub use super::stats::*;
pub use super::stream::*;
