//! kore-boot-test: helpers for booting Kore guest images on the Kore VMM in host tests.
//!
//! The images are built by `guest-kernel/build.sh` (or the two `cargo build --target` commands
//! in the README) into the same target directory as these tests; `KORE_GUEST_KERNEL` and
//! `KORE_GUEST_IMAGE` override the paths.

use std::path::PathBuf;
use std::time::Duration;

use kore_vmm::{HugePageSize, Vm, VmConfig};

/// The kernel and ring-3 image to boot.
#[derive(Debug, Clone)]
pub struct Images {
    /// The kernel ELF.
    pub kernel: PathBuf,
    /// The ring-3 image ELF.
    pub user: PathBuf,
}

/// The target directory this test binary was built into (`<target>/<profile>/deps/<exe>`).
fn target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.to_path_buf())
}

/// Finds the guest images (the kernel and kore-demo), or says how to build them.
pub fn images() -> Result<Images, String> {
    find_images("KORE_GUEST_IMAGE", "kore-demo")
}

/// The kernel and the appliance image (`kore-appliance`; `KORE_APPLIANCE_IMAGE` overrides).
pub fn appliance_images() -> Result<Images, String> {
    find_images("KORE_APPLIANCE_IMAGE", "kore-appliance")
}

fn find_images(user_var: &str, user_name: &str) -> Result<Images, String> {
    let t = target_dir().ok_or("cannot locate the target directory")?;
    let kernel = std::env::var_os("KORE_GUEST_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| t.join("x86_64-unknown-none/release/kore-kernel"));
    let user = std::env::var_os(user_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| t.join("x86_64-unknown-linux-gnu/release").join(user_name));
    for p in [&kernel, &user] {
        if !p.is_file() {
            return Err(format!(
                "guest image {} is missing: run guest-kernel/build.sh with the same CARGO_TARGET_DIR first",
                p.display()
            ));
        }
    }
    Ok(Images { kernel, user })
}

/// What a finished boot left behind.
#[derive(Debug)]
pub struct Outcome {
    /// The guest's exit status.
    pub status: u32,
    /// The console output.
    pub console: Vec<String>,
    /// Values the guest wrote to the marker port, with the time since the VM started.
    pub markers: Vec<(u32, Duration)>,
}

impl Outcome {
    /// True if some console line contains `s`.
    pub fn said(&self, s: &str) -> bool {
        self.console.iter().any(|l| l.contains(s))
    }
}

/// A VM configuration for the images: `vcpus`, 256 MiB, 2 MiB hugepages, `cmdline`.
pub fn config(img: &Images, vcpus: u32, cmdline: &str) -> VmConfig {
    VmConfig::new(&img.kernel)
        .user_image(&img.user)
        .vcpus(vcpus)
        .memory_mib(256)
        .hugepages(HugePageSize::Size2M)
        .cmdline(cmdline)
}

/// Boots `config` and waits (at most `timeout`) for the guest to exit.
pub fn boot(config: VmConfig, timeout: Duration) -> Result<Outcome, String> {
    let vm = Vm::start(config, &mut |_| {}).map_err(|e| format!("VM start failed: {e}"))?;
    match vm.wait_timeout(timeout) {
        Some(r) => {
            let console = vm.console_lines();
            let status =
                r.map_err(|e| format!("VM failed: {e}\nconsole:\n{}", console.join("\n")))?;
            Ok(Outcome { status, console, markers: vm.markers() })
        }
        None => {
            let console = vm.console_lines();
            vm.stop();
            Err(format!("guest did not exit within {timeout:?}\nconsole:\n{}", console.join("\n")))
        }
    }
}
