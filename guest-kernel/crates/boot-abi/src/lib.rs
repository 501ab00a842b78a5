//! The boot ABI between the Kore VMM (`kore-vmm`) and the Kore guest kernel.
//!
//! This crate is `no_std`, has no dependencies and is shared by both sides. It
//! fixes three things, plus the virtio wire both sides speak ([`virtio`]):
//!
//! 1. **The guest-physical layout** ([`layout`]): where the VMM puts page
//!    tables, descriptor tables, per-CPU stacks, the [`BootInfo`] block, the
//!    kernel image, the optional ring-3 user image, free RAM, the preloaded
//!    model pack and the device (MMIO) window.
//! 2. **The [`BootInfo`] block** (versioned, `#[repr(C)]`) the VMM writes at
//!    [`layout::BOOT_INFO`]: memory map, preloaded files (the pack), vCPU
//!    count, TSC frequency, devices, I/O ports and the command line.
//! 3. **The per-vCPU entry contract** ([`entry`]): the CPU state each vCPU
//!    starts in, which registers hold what, and how application processors
//!    (APs) are released.
//!
//! # Summary of the contract
//!
//! * Every vCPU starts **directly in 64-bit long mode at CPL 0** on the
//!   kernel ELF's entry point (no real mode, no INIT/SIPI), paging on with
//!   VMM-built identity page tables (2 MiB pages), a GDT in Linux's layout, a
//!   per-CPU 64-bit TSS (RSP0, IST1 and an I/O-permission bitmap that lets
//!   ring 3 use the serial and debug-exit ports), and SSE/AVX enabled
//!   (CR4.OSFXSR|OSXMMEXCPT|OSXSAVE, XCR0 set by the VMM).
//! * `rdi` = guest-physical (= virtual, identity mapped) address of
//!   [`BootInfo`], `rsi` = CPU index (0 is the boot CPU), `rdx` = vCPU count,
//!   `rsp` = top of that CPU's kernel stack (16-byte aligned). A kernel entry
//!   can therefore be written as
//!   `extern "sysv64" fn(info: *const BootInfo, cpu: u64, ncpus: u64) -> !`.
//! * CPU 0 runs first. The other CPUs are held by the VMM until CPU 0 writes
//!   any value to [`ports::SMP_RELEASE`]; they then start at
//!   [`BootInfo::ap_entry`] if CPU 0 stored a non-zero address there, else at
//!   the kernel entry point again, with their own stacks and TSS.
//! * The IDT at [`layout::IDT`] is zeroed and loaded (limit 4095): the guest
//!   fills the gates it needs. A fault before that is a triple fault, which
//!   the VMM reports with registers and the last console lines.
//! * The guest ends the VM by writing a 32-bit status to
//!   [`ports::DEBUG_EXIT`] (`out dx, eax`); the VM exits with that status.
//!
//! # Example: a guest reading its boot info
//!
//! ```
//! use kore_boot_abi::{BootInfo, MemKind};
//!
//! // The VMM side builds the block (here in host memory, for the example).
//! let mut info = BootInfo::new();
//! info.vcpu_count = 2;
//! info.push_mem_region(0, 8 << 20, MemKind::BootData).unwrap();
//! info.push_mem_region(96 << 20, 160 << 20, MemKind::Usable).unwrap();
//! info.set_cmdline(b"console=serial").unwrap();
//!
//! // The guest side checks it before trusting anything else.
//! info.validate().unwrap();
//! let usable: u64 = info
//!     .mem_regions()
//!     .iter()
//!     .filter(|r| r.kind == MemKind::Usable as u32)
//!     .map(|r| r.size)
//!     .sum();
//! assert_eq!(usable, 160 << 20);
//! assert_eq!(info.cmdline(), b"console=serial");
//! ```
#![no_std]
#![forbid(unsafe_code)]

pub mod entry;
pub mod kore_dma;
pub mod layout;
pub mod ports;
pub mod virtio;

/// `BootInfo::magic`: the bytes `KOREBOOT` read as a little-endian `u64`.
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"KOREBOOT");

/// The boot ABI version this crate describes. Bumped on any incompatible
/// change of the layout, [`BootInfo`] or the entry contract.
pub const BOOT_ABI_VERSION: u32 = 2;

/// Maximum number of memory-map entries in [`BootInfo`].
pub const MAX_MEM_REGIONS: usize = 32;
/// Maximum number of preloaded files in [`BootInfo`].
pub const MAX_FILES: usize = 16;
/// Maximum length of a preloaded file's name, in bytes (UTF-8, no NUL needed).
pub const MAX_FILE_NAME: usize = 64;
/// Maximum number of devices in [`BootInfo`].
pub const MAX_DEVICES: usize = 8;
/// Maximum command-line length, in bytes.
pub const MAX_CMDLINE: usize = 2048;

/// What a memory-map entry ([`MemRegion`]) holds.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Free RAM the guest may use for anything.
    Usable = 1,
    /// VMM-written boot data: page tables, GDT/TSS, IDT, boot info, stacks.
    /// Keep it while any of it is in use (the IDT, GDT and TSS always are).
    BootData = 2,
    /// The kernel ELF's loaded segments (rounded to 2 MiB).
    Kernel = 3,
    /// The ring-3 user image's loaded segments (rounded to 2 MiB).
    UserImage = 4,
    /// Preloaded files (the model pack); mapped read-only for ring 3.
    Preloaded = 5,
    /// Device MMIO window (PCI, virtio-mmio, IOAPIC, LAPIC): not RAM.
    Device = 6,
}

impl MemKind {
    /// The kind for a raw `u32` value, or `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Usable,
            2 => Self::BootData,
            3 => Self::Kernel,
            4 => Self::UserImage,
            5 => Self::Preloaded,
            6 => Self::Device,
            _ => return None,
        })
    }
}

/// One memory-map entry: `[base, base + size)` of kind [`MemKind`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemRegion {
    /// Guest-physical start (2 MiB aligned for RAM entries).
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
    /// A [`MemKind`] as `u32`.
    pub kind: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// A file the VMM preloaded into guest RAM before boot (e.g. a pack's
/// `weights.safetensors`). Its bytes are at `[gpa, gpa + size)`; the rest of
/// its 2 MiB-rounded slot is zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreloadedFile {
    /// Guest-physical address of the first byte (2 MiB aligned).
    pub gpa: u64,
    /// Length of the file in bytes.
    pub size: u64,
    /// Length of `name` in bytes.
    pub name_len: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The file's name (its base name, e.g. `weights.safetensors`), UTF-8.
    pub name: [u8; MAX_FILE_NAME],
}

impl Default for PreloadedFile {
    fn default() -> Self {
        Self { gpa: 0, size: 0, name_len: 0, reserved: 0, name: [0; MAX_FILE_NAME] }
    }
}

impl PreloadedFile {
    /// The file's name bytes.
    pub fn name(&self) -> &[u8] {
        &self.name[..(self.name_len as usize).min(MAX_FILE_NAME)]
    }
}

/// The kind of a device in [`BootInfo::devices`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// virtio-mmio (version 2) transport carrying a virtio-vsock device.
    VirtioVsock = 1,
    /// A PCI host bridge (bus 0): `mmio_base`/`mmio_size` = the ECAM window
    /// ([`layout::PCI_ECAM_BASE`], [`layout::PCI_ECAM_SIZE`]), `arg0` = the
    /// 32-bit BAR window base ([`layout::PCI_MMIO32_BASE`]), `gsi` and
    /// `vector` 0 (functions interrupt by MSI-X only). The VMM assigned every
    /// BAR before boot and left each function's command register 0.
    PciHostBridge = 2,
}

/// A device the VMM attached.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Device {
    /// A [`DeviceKind`] as `u32`.
    pub kind: u32,
    /// The interrupt line: a GSI, i.e. an IOAPIC input pin.
    pub gsi: u32,
    /// Guest-physical base of the device's MMIO registers.
    pub mmio_base: u64,
    /// Size of the MMIO register window.
    pub mmio_size: u64,
    /// The vector the VMM programmed into the IOAPIC for `gsi` (edge
    /// triggered, fixed delivery to APIC id 0, unmasked), or 0 if the VMM left
    /// the pin masked. The guest may reprogram the IOAPIC freely.
    pub vector: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Device-specific: for [`DeviceKind::VirtioVsock`], the guest's CID;
    /// for [`DeviceKind::PciHostBridge`], the 32-bit BAR window base.
    pub arg0: u64,
}

/// An address range the VMM loaded an ELF into, with its entry point.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ImageInfo {
    /// Lowest guest-physical address of a loaded segment (0 if absent).
    pub start: u64,
    /// End (exclusive) of the highest loaded segment, including `.bss`.
    pub end: u64,
    /// The ELF's entry point (0 if absent).
    pub entry: u64,
}

/// The boot-info block the VMM writes at [`layout::BOOT_INFO`].
///
/// All addresses are guest-physical; the initial page tables identity-map
/// them. Arrays have fixed capacity; the `*_len` fields say how many entries
/// are valid. Check [`BootInfo::validate`] before using the rest.
#[repr(C)]
#[derive(Clone, Debug)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u64,
    /// [`BOOT_ABI_VERSION`] of the VMM that wrote this block.
    pub version: u32,
    /// `size_of::<BootInfo>()` as the VMM saw it.
    pub size: u32,
    /// Number of vCPUs (CPU indices `0..vcpu_count`; APIC id = CPU index).
    pub vcpu_count: u32,
    /// Serial console (16550) base I/O port, e.g. [`ports::SERIAL_COM1`].
    pub serial_port: u16,
    /// Debug-exit I/O port ([`ports::DEBUG_EXIT`]).
    pub debug_exit_port: u16,
    /// AP release I/O port ([`ports::SMP_RELEASE`]).
    pub smp_release_port: u16,
    /// Timestamp-marker I/O port ([`ports::MARKER`]).
    pub marker_port: u16,
    /// GSI (IOAPIC pin) of the serial port's interrupt.
    pub serial_gsi: u32,
    /// TSC frequency in kHz (as KVM reports it; RDTSC is native in ring 3).
    pub tsc_khz: u64,
    /// Where the guest's APs start after release; written by the **guest**
    /// (CPU 0) before it writes [`ports::SMP_RELEASE`]. 0 = kernel entry.
    pub ap_entry: u64,
    /// The kernel ELF as loaded.
    pub kernel: ImageInfo,
    /// The optional ring-3 user image ELF as loaded (all zero if none).
    pub user_image: ImageInfo,
    /// Guest-physical address of the PML4 (also in CR3 at entry).
    pub pml4: u64,
    /// The XCR0 the VMM set (the guest CPU level's SIMD state; 0 = not stated).
    /// Ring 3 caps its SIMD feature detection to it: on nested hosts of the
    /// PVM kind ring 3's CPUID and XGETBV report the host's features whatever
    /// the VMM set, so this is how the guest learns the CPU it was given.
    pub xcr0: u64,
    /// Number of valid entries in `mem_map`.
    pub mem_map_len: u32,
    /// Number of valid entries in `files`.
    pub files_len: u32,
    /// Number of valid entries in `devices`.
    pub devices_len: u32,
    /// Length of `cmdline` in bytes.
    pub cmdline_len: u32,
    /// The memory map, sorted by `base`, non-overlapping.
    pub mem_map: [MemRegion; MAX_MEM_REGIONS],
    /// Preloaded files, in the order the VMM was given them.
    pub files: [PreloadedFile; MAX_FILES],
    /// Attached devices.
    pub devices: [Device; MAX_DEVICES],
    /// The command line (UTF-8, no NUL needed).
    pub cmdline: [u8; MAX_CMDLINE],
}

/// Why a [`BootInfo`] was rejected or could not be extended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootInfoError {
    /// `magic` is wrong: this is not a Kore boot-info block.
    BadMagic,
    /// The VMM speaks another ABI version: rebuild the kernel and VMM together.
    VersionMismatch {
        /// The version in the block.
        found: u32,
    },
    /// `size` differs from this crate's `BootInfo` size: rebuild both sides.
    SizeMismatch {
        /// The size in the block.
        found: u32,
    },
    /// A `*_len` field exceeds its array's capacity.
    LengthOutOfRange,
    /// The memory map is unsorted, overlapping or has an unknown kind.
    BadMemoryMap,
    /// An array is full: raise the `MAX_*` constant (an ABI change).
    Full,
    /// A string is longer than its field: shorten it.
    TooLong,
}

impl core::fmt::Display for BootInfoError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BadMagic => f.write_str("boot info magic is wrong: not a Kore boot block"),
            Self::VersionMismatch { found } => write!(
                f,
                "boot ABI version {found}, expected {BOOT_ABI_VERSION}: rebuild the kernel and the VMM from one tree"
            ),
            Self::SizeMismatch { found } => write!(
                f,
                "boot info size {found}, expected {}: rebuild the kernel and the VMM from one tree",
                core::mem::size_of::<BootInfo>()
            ),
            Self::LengthOutOfRange => f.write_str("a boot info length field exceeds its capacity"),
            Self::BadMemoryMap => f.write_str("the boot memory map is unsorted, overlapping or has an unknown kind"),
            Self::Full => f.write_str("a boot info table is full"),
            Self::TooLong => f.write_str("a boot info string is too long for its field"),
        }
    }
}

impl Default for BootInfo {
    fn default() -> Self {
        Self::new()
    }
}

impl BootInfo {
    /// An empty block with magic, version, size and the fixed ports filled in.
    pub const fn new() -> Self {
        Self {
            magic: BOOT_INFO_MAGIC,
            version: BOOT_ABI_VERSION,
            size: core::mem::size_of::<BootInfo>() as u32,
            vcpu_count: 0,
            serial_port: ports::SERIAL_COM1,
            debug_exit_port: ports::DEBUG_EXIT,
            smp_release_port: ports::SMP_RELEASE,
            marker_port: ports::MARKER,
            serial_gsi: ports::SERIAL_GSI,
            tsc_khz: 0,
            ap_entry: 0,
            kernel: ImageInfo { start: 0, end: 0, entry: 0 },
            user_image: ImageInfo { start: 0, end: 0, entry: 0 },
            pml4: layout::PML4,
            xcr0: 0,
            mem_map_len: 0,
            files_len: 0,
            devices_len: 0,
            cmdline_len: 0,
            mem_map: [MemRegion { base: 0, size: 0, kind: 0, reserved: 0 }; MAX_MEM_REGIONS],
            files: [PreloadedFile {
                gpa: 0,
                size: 0,
                name_len: 0,
                reserved: 0,
                name: [0; MAX_FILE_NAME],
            }; MAX_FILES],
            devices: [Device {
                kind: 0,
                gsi: 0,
                mmio_base: 0,
                mmio_size: 0,
                vector: 0,
                reserved: 0,
                arg0: 0,
            }; MAX_DEVICES],
            cmdline: [0; MAX_CMDLINE],
        }
    }

    /// Checks magic, version, size, lengths and the memory map's order.
    pub fn validate(&self) -> Result<(), BootInfoError> {
        if self.magic != BOOT_INFO_MAGIC {
            return Err(BootInfoError::BadMagic);
        }
        if self.version != BOOT_ABI_VERSION {
            return Err(BootInfoError::VersionMismatch { found: self.version });
        }
        if self.size as usize != core::mem::size_of::<BootInfo>() {
            return Err(BootInfoError::SizeMismatch { found: self.size });
        }
        if self.mem_map_len as usize > MAX_MEM_REGIONS
            || self.files_len as usize > MAX_FILES
            || self.devices_len as usize > MAX_DEVICES
            || self.cmdline_len as usize > MAX_CMDLINE
        {
            return Err(BootInfoError::LengthOutOfRange);
        }
        let mut prev_end = 0u64;
        for r in self.mem_regions() {
            let end = r.base.checked_add(r.size).ok_or(BootInfoError::BadMemoryMap)?;
            if r.base < prev_end || MemKind::from_u32(r.kind).is_none() {
                return Err(BootInfoError::BadMemoryMap);
            }
            prev_end = end;
        }
        Ok(())
    }

    /// The valid memory-map entries.
    pub fn mem_regions(&self) -> &[MemRegion] {
        &self.mem_map[..(self.mem_map_len as usize).min(MAX_MEM_REGIONS)]
    }

    /// The valid preloaded-file entries.
    pub fn files(&self) -> &[PreloadedFile] {
        &self.files[..(self.files_len as usize).min(MAX_FILES)]
    }

    /// The preloaded file called `name`, if any.
    pub fn file(&self, name: &[u8]) -> Option<&PreloadedFile> {
        self.files().iter().find(|f| f.name() == name)
    }

    /// The valid device entries.
    pub fn devices(&self) -> &[Device] {
        &self.devices[..(self.devices_len as usize).min(MAX_DEVICES)]
    }

    /// The command line bytes.
    pub fn cmdline(&self) -> &[u8] {
        &self.cmdline[..(self.cmdline_len as usize).min(MAX_CMDLINE)]
    }

    /// Appends a memory-map entry (keep entries sorted by `base`).
    pub fn push_mem_region(
        &mut self,
        base: u64,
        size: u64,
        kind: MemKind,
    ) -> Result<(), BootInfoError> {
        let i = self.mem_map_len as usize;
        let slot = self.mem_map.get_mut(i).ok_or(BootInfoError::Full)?;
        *slot = MemRegion { base, size, kind: kind as u32, reserved: 0 };
        self.mem_map_len += 1;
        Ok(())
    }

    /// Appends a preloaded-file entry.
    pub fn push_file(&mut self, name: &[u8], gpa: u64, size: u64) -> Result<(), BootInfoError> {
        if name.len() > MAX_FILE_NAME {
            return Err(BootInfoError::TooLong);
        }
        let i = self.files_len as usize;
        let slot = self.files.get_mut(i).ok_or(BootInfoError::Full)?;
        let mut f =
            PreloadedFile { gpa, size, name_len: name.len() as u32, ..PreloadedFile::default() };
        f.name[..name.len()].copy_from_slice(name);
        *slot = f;
        self.files_len += 1;
        Ok(())
    }

    /// Appends a device entry.
    pub fn push_device(&mut self, dev: Device) -> Result<(), BootInfoError> {
        let i = self.devices_len as usize;
        let slot = self.devices.get_mut(i).ok_or(BootInfoError::Full)?;
        *slot = dev;
        self.devices_len += 1;
        Ok(())
    }

    /// Sets the command line.
    pub fn set_cmdline(&mut self, cmdline: &[u8]) -> Result<(), BootInfoError> {
        if cmdline.len() > MAX_CMDLINE {
            return Err(BootInfoError::TooLong);
        }
        self.cmdline = [0; MAX_CMDLINE];
        self.cmdline[..cmdline.len()].copy_from_slice(cmdline);
        self.cmdline_len = cmdline.len() as u32;
        Ok(())
    }

    /// The block as bytes, exactly as the VMM writes it into guest memory.
    ///
    /// `BootInfo` is `#[repr(C)]` with only integer fields and no padding
    /// (checked by a test), so this is its in-memory representation.
    pub fn to_bytes(&self, out: &mut [u8; core::mem::size_of::<BootInfo>()]) {
        let mut w = Writer { buf: out, pos: 0 };
        w.u64(self.magic);
        w.u32(self.version);
        w.u32(self.size);
        w.u32(self.vcpu_count);
        w.u16(self.serial_port);
        w.u16(self.debug_exit_port);
        w.u16(self.smp_release_port);
        w.u16(self.marker_port);
        w.u32(self.serial_gsi);
        w.u64(self.tsc_khz);
        w.u64(self.ap_entry);
        for img in [&self.kernel, &self.user_image] {
            w.u64(img.start);
            w.u64(img.end);
            w.u64(img.entry);
        }
        w.u64(self.pml4);
        w.u64(self.xcr0);
        w.u32(self.mem_map_len);
        w.u32(self.files_len);
        w.u32(self.devices_len);
        w.u32(self.cmdline_len);
        for r in &self.mem_map {
            w.u64(r.base);
            w.u64(r.size);
            w.u32(r.kind);
            w.u32(r.reserved);
        }
        for f in &self.files {
            w.u64(f.gpa);
            w.u64(f.size);
            w.u32(f.name_len);
            w.u32(f.reserved);
            w.bytes(&f.name);
        }
        for d in &self.devices {
            w.u32(d.kind);
            w.u32(d.gsi);
            w.u64(d.mmio_base);
            w.u64(d.mmio_size);
            w.u32(d.vector);
            w.u32(d.reserved);
            w.u64(d.arg0);
        }
        w.bytes(&self.cmdline);
        debug_assert_eq!(w.pos, out_len());
    }

    /// Byte offset of [`BootInfo::ap_entry`] inside the block (the one field
    /// the guest writes and the VMM reads back).
    pub const AP_ENTRY_OFFSET: usize = 8 + 4 + 4 + 4 + 2 * 4 + 4 + 8;
}

const fn out_len() -> usize {
    core::mem::size_of::<BootInfo>()
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

// The block must fit its slot in the layout.
const _: () = assert!(core::mem::size_of::<BootInfo>() as u64 <= layout::BOOT_INFO_SIZE);

#[cfg(test)]
mod tests;
