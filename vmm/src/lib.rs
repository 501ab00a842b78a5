//! Kore VMM: runs the Kore guest on KVM with guest RAM in preallocated
//! hugepages, the model pack preloaded, a serial console, a debug-exit port
//! and virtio-vsock over a Unix socket (Firecracker's hybrid protocol).
//!
//! The guest-facing contract (memory layout, boot info, CPU state at entry)
//! lives in [`kore_boot_abi`]. The launcher uses three things:
//!
//! ```no_run
//! use kore_vmm::{HugePageSize, Vm, VmConfig};
//!
//! let config = VmConfig::new("target/kore-kernel.elf")
//!     .vcpus(2)
//!     .memory_mib(1024)
//!     .hugepages(HugePageSize::Size2M)
//!     .preload("model-packs/tiny/weights.safetensors")
//!     .vsock_uds("/run/kore/vsock.sock");
//! let vm = Vm::start(config, &mut |p| eprintln!("preload {}/{}", p.done, p.total))?;
//! let stopper = vm.stopper(); // e.g. for a Ctrl-C handler
//! # drop(stopper);
//! let status = vm.wait()?; // guest's debug-exit status
//! println!("guest exited with {status}");
//! # Ok::<(), kore_vmm::VmError>(())
//! ```

pub mod boot;
pub mod config;
pub mod cpu;
pub mod cpu_level;
pub mod devices;
pub mod loader;
pub mod memory;
pub mod pci;
pub mod preload;
pub mod running;
pub mod signals;
pub mod vcpu;
pub mod vm;
pub mod vsock;

pub use config::{HugePageSize, VmConfig};
pub use cpu_level::GuestCpu;
pub use devices::bus::BusDevice;
pub use preload::Progress;
pub use running::{CrashReport, RunningVm, Stopper};
pub use vm::{Vm, VmError};
