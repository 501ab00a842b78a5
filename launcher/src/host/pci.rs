//! PCI devices in sysfs: SR-IOV virtual functions (`sriov_numvfs`), binding a
//! device to vfio-pci (`driver_override`, unbind, `drivers_probe`), and the
//! viability of its IOMMU group.

use super::{Changes, HostError, Sys};

/// Drivers that leave a device usable alongside a vfio-pci group member.
const HARMLESS_DRIVERS: [&str; 3] = ["vfio-pci", "pci-stub", "pcieport"];

/// Normalises a PCI address to `dddd:bb:dd.f` (lowercase; domain 0000 added when missing).
pub fn normalize_addr(addr: &str) -> Result<String, HostError> {
    let bad = || HostError::BadAddress(addr.to_string());
    let lower = addr.trim().to_ascii_lowercase();
    let full = if lower.matches(':').count() == 1 { format!("0000:{lower}") } else { lower };
    let (rest, func) = full.rsplit_once('.').ok_or_else(bad)?;
    let parts: Vec<&str> = rest.split(':').collect();
    let widths = [4, 2, 2];
    if parts.len() != 3 || func.len() != 1 {
        return Err(bad());
    }
    for (part, width) in parts.iter().zip(widths) {
        if part.len() != width || !part.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
    }
    let device = u8::from_str_radix(parts[2], 16).map_err(|_| bad())?;
    let function = func.parse::<u8>().map_err(|_| bad())?;
    if device > 0x1f || function > 7 {
        return Err(bad());
    }
    Ok(full)
}

/// `/sys/bus/pci/devices/ADDR`.
pub fn device_dir(addr: &str) -> String {
    format!("/sys/bus/pci/devices/{addr}")
}

/// The driver a device is bound to, if any.
pub fn driver_of(sys: &dyn Sys, addr: &str) -> Option<String> {
    sys.link_name(&format!("{}/driver", device_dir(addr)))
}

/// Whether the device is a PCI-to-PCI bridge (class 0x0604xx).
pub fn is_bridge(sys: &dyn Sys, addr: &str) -> bool {
    sys.read(&format!("{}/class", device_dir(addr)))
        .is_ok_and(|c| c.trim().to_ascii_lowercase().starts_with("0x0604"))
}

/// Makes sure `pf` has at least `count` VFs enabled. Never removes VFs:
/// a different non-zero count is an error that says how to reset it.
pub fn enable_vfs(changes: &mut Changes<'_>, pf: &str, count: u64) -> Result<(), HostError> {
    let sys = changes.sys();
    let dir = device_dir(pf);
    if !sys.exists(&dir) {
        return Err(HostError::NoDevice { addr: pf.to_string(), path: sys.shown(&dir) });
    }
    let total_path = format!("{dir}/sriov_totalvfs");
    if !sys.exists(&total_path) {
        return Err(HostError::NoSriov { addr: pf.to_string() });
    }
    let total = sys.read_u64(&total_path)?;
    if count > total {
        return Err(HostError::TooManyVfs { addr: pf.to_string(), total, wanted: count });
    }
    let num_path = format!("{dir}/sriov_numvfs");
    let current = sys.read_u64(&num_path)?;
    if current >= count && current > 0 {
        return changes.note(&format!("[ok] {pf}: {current} SR-IOV VFs enabled (of {total})"));
    }
    if current != 0 {
        return Err(HostError::VfsInUse {
            addr: pf.to_string(),
            current,
            wanted: count,
            path: sys.shown(&num_path),
        });
    }
    changes.write(
        &num_path,
        &count.to_string(),
        &format!("enable {count} SR-IOV VF(s) on {pf} (supports {total})"),
    )?;
    if !changes.dry_run() {
        let now = sys.read_u64(&num_path)?;
        if now != count {
            return Err(HostError::Parse {
                path: sys.shown(&num_path),
                contents: now.to_string(),
                expected: "the VF count just written (see `dmesg` for the driver's error)",
            });
        }
    }
    Ok(())
}

/// The address of VF `index` of `pf`: from the `virtfnN` link, or (before
/// the VFs exist, e.g. in a dry run) computed from `sriov_offset` and
/// `sriov_stride` as the PCI spec defines the VF routing IDs.
pub fn vf_address(sys: &dyn Sys, pf: &str, index: u64) -> Result<String, HostError> {
    let dir = device_dir(pf);
    let link = format!("{dir}/virtfn{index}");
    if let Some(name) = sys.link_name(&link) {
        return normalize_addr(&name);
    }
    let offset_path = format!("{dir}/sriov_offset");
    if !sys.exists(&offset_path) {
        return Err(HostError::NoVf { addr: pf.to_string(), index, path: sys.shown(&link) });
    }
    let offset = sys.read_u64(&offset_path)?;
    let stride = sys.read_u64(&format!("{dir}/sriov_stride"))?;
    let (domain, rest) = pf.split_at(4);
    let bus =
        u64::from_str_radix(&rest[1..3], 16).map_err(|_| HostError::BadAddress(pf.to_string()))?;
    let devfn = u64::from_str_radix(&rest[4..6], 16)
        .map_err(|_| HostError::BadAddress(pf.to_string()))?
        << 3
        | rest[7..8].parse::<u64>().map_err(|_| HostError::BadAddress(pf.to_string()))?;
    let rid = (bus << 8 | devfn) + offset + index * stride;
    Ok(format!("{domain}:{:02x}:{:02x}.{}", (rid >> 8) & 0xff, (rid >> 3) & 0x1f, rid & 7))
}

/// Binds `addr` to vfio-pci: `driver_override`, unbind from its driver,
/// `drivers_probe`, then confirms the binding. In a dry run for a device
/// that does not exist yet (a VF about to be created), `predicted_driver`
/// is the driver it will come up with.
pub fn bind_vfio(
    changes: &mut Changes<'_>,
    addr: &str,
    predicted_driver: Option<&str>,
) -> Result<(), HostError> {
    let sys = changes.sys();
    let dir = device_dir(addr);
    let exists = sys.exists(&dir);
    if !exists && !changes.dry_run() {
        return Err(HostError::NoDevice { addr: addr.to_string(), path: sys.shown(&dir) });
    }
    let vfio = "/sys/bus/pci/drivers/vfio-pci";
    if !sys.exists(vfio) {
        return Err(HostError::NoVfioPci { path: sys.shown(vfio) });
    }
    let driver = if exists { driver_of(sys, addr) } else { predicted_driver.map(str::to_string) };
    if driver.as_deref() == Some("vfio-pci") {
        return changes.note(&format!("[ok] {addr} is bound to vfio-pci"));
    }
    changes.write(
        &format!("{dir}/driver_override"),
        "vfio-pci",
        &format!("let only vfio-pci claim {addr}"),
    )?;
    if let Some(current) = &driver {
        let unbind = format!("/sys/bus/pci/drivers/{current}/unbind");
        changes.write(&unbind, addr, &format!("release {addr} from {current}"))?;
    }
    changes.write("/sys/bus/pci/drivers_probe", addr, &format!("bind {addr} to vfio-pci"))?;
    if !changes.dry_run() {
        let now = driver_of(sys, addr);
        if now.as_deref() != Some("vfio-pci") {
            return Err(HostError::BindFailed {
                addr: addr.to_string(),
                driver: now.unwrap_or_else(|| "no driver".to_string()),
            });
        }
        changes.note(&format!("[ok] {addr} is now bound to vfio-pci"))?;
    }
    Ok(())
}

/// An IOMMU group and its members with their drivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group number.
    pub number: String,
    /// Every device in the group and its driver.
    pub devices: Vec<(String, Option<String>)>,
}

/// The IOMMU group of `addr`, with its members.
pub fn iommu_group(sys: &dyn Sys, addr: &str) -> Result<Group, HostError> {
    let number = sys
        .link_name(&format!("{}/iommu_group", device_dir(addr)))
        .ok_or_else(|| HostError::NoIommuGroup { addr: addr.to_string() })?;
    let devices = sys
        .list(&format!("/sys/kernel/iommu_groups/{number}/devices"))
        .into_iter()
        .map(|dev| {
            let driver = driver_of(sys, &dev);
            (dev, driver)
        })
        .collect();
    Ok(Group { number, devices })
}

/// Checks that every other device in `addr`'s group is bound to vfio-pci,
/// pci-stub or pcieport, has no driver, or is a bridge: otherwise VFIO
/// refuses the group.
pub fn check_group(sys: &dyn Sys, addr: &str) -> Result<Group, HostError> {
    let group = iommu_group(sys, addr)?;
    let offenders: Vec<String> = group
        .devices
        .iter()
        .filter(|(dev, _)| dev != addr && !is_bridge(sys, dev))
        .filter_map(|(dev, driver)| {
            let driver = driver.as_deref()?;
            (!HARMLESS_DRIVERS.contains(&driver)).then(|| format!("{dev} ({driver})"))
        })
        .collect();
    if !offenders.is_empty() {
        return Err(HostError::GroupNotViable {
            addr: addr.to_string(),
            group: group.number,
            others: offenders.join(", "),
        });
    }
    Ok(group)
}
