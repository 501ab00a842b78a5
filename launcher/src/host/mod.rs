//! Host preparation and checks: hugepage pools, SR-IOV virtual functions,
//! vfio-pci binding, IOMMU groups, who may open /dev/kvm, KVM and CPU probing.
//!
//! Everything that touches `/sys`, `/proc` or `/dev` goes through the [`Sys`]
//! trait, implemented for the real machine by [`SysRoot`] (a root directory,
//! `/` by default). Tests point a `SysRoot` at a fake tree in a temporary
//! directory, or wrap it in a fake kernel that reacts to writes, and assert
//! the exact writes made. This module depends on nothing else in the launcher.

pub mod changes;
pub mod checks;
pub mod cpu;
pub mod error;
pub mod hugepages;
pub mod kvm;
pub mod kvm_access;
pub mod pci;
pub mod prepare;
pub mod root;
pub mod sizing;

pub use changes::Changes;
pub use error::HostError;
pub use hugepages::HugepageSize;
pub use root::{Sys, SysRoot};
