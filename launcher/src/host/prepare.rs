//! What `kore-launch setup` does, in order: size the appliance's memory,
//! reserve hugepages for it, enable SR-IOV VFs on a GPU, bind a VF to
//! vfio-pci and check its IOMMU group. Every write goes through [`Changes`].

use super::hugepages::{self, HugepageSize};
use super::pci;
use super::sizing::Budget;
use super::{Changes, HostError};

/// What to prepare.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The memory the appliance needs.
    pub budget: Budget,
    /// Hugepage size backing guest memory.
    pub hugepage_size: HugepageSize,
    /// GPU physical function on which to enable VFs.
    pub gpu: Option<String>,
    /// VFs to enable on `gpu`.
    pub vfs: u64,
    /// VF to bind to vfio-pci (default: the first VF of `gpu`).
    pub vf: Option<String>,
}

/// Carries out `plan`, printing each step and change.
pub fn prepare(changes: &mut Changes<'_>, plan: &Plan) -> Result<(), HostError> {
    changes.note("guest memory for the appliance:")?;
    for line in plan.budget.lines() {
        changes.note(&format!("  {line}"))?;
    }
    hugepages::reserve(
        changes,
        plan.hugepage_size,
        plan.budget.guest_bytes_for(plan.hugepage_size),
    )?;
    let mut predicted = None;
    let vf = match &plan.gpu {
        Some(gpu) => {
            let pf = pci::normalize_addr(gpu)?;
            pci::enable_vfs(changes, &pf, plan.vfs)?;
            predicted = predicted_vf_driver(changes, &pf);
            match &plan.vf {
                Some(vf) => Some(pci::normalize_addr(vf)?),
                None => Some(pci::vf_address(changes.sys(), &pf, 0)?),
            }
        }
        None => plan.vf.as_deref().map(pci::normalize_addr).transpose()?,
    };
    let Some(vf) = vf else {
        changes.note(
            "[ok] no GPU given (--gpu/--vf or `vf` in launch.toml): the appliance runs on the CPU",
        )?;
        return summary(changes);
    };
    pci::bind_vfio(changes, &vf, predicted.as_deref())?;
    if changes.sys().exists(&pci::device_dir(&vf)) {
        let group = pci::check_group(changes.sys(), &vf)?;
        let node = format!("/dev/vfio/{}", group.number);
        let node_state =
            if changes.sys().exists(&node) { "present" } else { "appears once vfio-pci binds" };
        changes.note(&format!(
            "[ok] IOMMU group {} of {vf} is viable ({} device(s)); {node} {node_state}",
            group.number,
            group.devices.len()
        ))?;
    } else {
        changes
            .note(&format!("[dry-run] the IOMMU group of {vf} is checked once the VF exists"))?;
    }
    changes.note(&format!(
        "to pass {vf} to the appliance, set `vf = \"{vf}\"` in launch.toml (or KORE_VF={vf})"
    ))?;
    summary(changes)
}

/// The driver a VF of `pf` comes up with: the PF's driver when
/// `sriov_drivers_autoprobe` is on (the kernel default), else none.
fn predicted_vf_driver(changes: &Changes<'_>, pf: &str) -> Option<String> {
    let sys = changes.sys();
    let autoprobe = sys
        .read(&format!("{}/sriov_drivers_autoprobe", pci::device_dir(pf)))
        .map(|v| v.trim() != "0")
        .unwrap_or(true);
    if autoprobe {
        pci::driver_of(sys, pf)
    } else {
        None
    }
}

fn summary(changes: &mut Changes<'_>) -> Result<(), HostError> {
    let n = changes.made().len();
    let text = match (changes.dry_run(), n) {
        (true, 0) | (false, 0) => "nothing to change: the host is ready".to_string(),
        (true, n) => format!(
            "dry run: {n} change(s) would be made; run without --dry-run (as root) to make them"
        ),
        (false, n) => format!("done: {n} change(s) made"),
    };
    changes.note(&text)
}
