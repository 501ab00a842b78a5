//! kore-rt-build: link settings for a Kore ring-3 image.
//!
//! A ring-3 image is a `#![no_std] #![no_main]` binary for `x86_64-unknown-linux-gnu` that
//! depends on `kore-rt`. Its `build.rs` is one line:
//!
//! ```ignore
//! fn main() { kore_rt_build::link_user_image(); }
//! ```
//!
//! and it is built with `cargo build --release --target x86_64-unknown-linux-gnu` (an explicit
//! `--target`, so host build scripts are unaffected) and `panic = "abort"`. The result is a
//! static, non-PIE ELF linked at `USER_IMAGE_BASE` that the VMM loads as the user image.

/// The linker script placing the image at `USER_IMAGE_BASE`.
pub const LINKER_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/user.ld");

/// Prints the cargo directives that link this package's binaries as a Kore ring-3 image.
pub fn link_user_image() {
    println!("cargo:rerun-if-changed={LINKER_SCRIPT}");
    for arg in ["-nostartfiles", "-nostdlib", "-static", "-no-pie", "-Wl,--build-id=none"] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-T{LINKER_SCRIPT}");
}
