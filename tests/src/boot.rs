//! Booting Kore guest images on the Kore VMM straight from a test (no launcher):
//! the images from [`crate::guest_images`], a small VM configuration, and the
//! outcome of one boot (exit status, console, markers).

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

/// The kernel and the test image (`kore-test-image`).
pub fn images() -> Result<Images, String> {
    let g = crate::guest_images();
    Ok(Images { kernel: g.kernel, user: g.test_image })
}

/// The kernel and the appliance image (`kore-appliance`).
pub fn appliance_images() -> Result<Images, String> {
    let g = crate::guest_images();
    Ok(Images { kernel: g.kernel, user: g.appliance })
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
