//! Build script: generates the C header with cbindgen and gives the shared
//! library its SONAME.
//!
//! The header is written to OUT_DIR on every build; a test compares it with
//! the committed `include/xlog_cuda.h`. `XLOG_WRITE_HEADER=1 cargo build`
//! (or a missing header) writes it into `include/` as well.

use std::env;
use std::path::PathBuf;

/// SONAME major: bumped when the C ABI breaks.
const SONAME_MAJOR: &str = "0";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-env-changed=XLOG_WRITE_HEADER");

    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libxlog_cuda.so.{SONAME_MAJOR}");
    }

    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("out dir"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = match cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
    {
        Ok(b) => b,
        Err(e) => {
            // A parse error in the crate is reported by rustc itself with a
            // better message; don't fail the build here.
            println!("cargo:warning=cbindgen could not generate the header: {e}");
            return;
        }
    };
    bindings.write_to_file(out_dir.join("xlog_cuda.h"));
    let committed = crate_dir.join("include").join("xlog_cuda.h");
    if env::var_os("XLOG_WRITE_HEADER").is_some_and(|v| v == "1") || !committed.exists() {
        bindings.write_to_file(committed);
    }
}
