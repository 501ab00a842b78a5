//! Links the kernel at its fixed guest-physical address (kernel.ld), not position-independent.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rerun-if-changed={dir}/kernel.ld");
    if std::env::var("TARGET").unwrap() == "x86_64-unknown-none" {
        println!("cargo:rustc-link-arg-bins=-T{dir}/kernel.ld");
        println!("cargo:rustc-link-arg-bins=--no-pie");
        println!("cargo:rustc-link-arg-bins=--build-id=none");
    }
}
