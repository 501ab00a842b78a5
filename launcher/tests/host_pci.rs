//! SR-IOV VFs, vfio-pci binding, IOMMU groups and the whole `setup` sequence
//! against fake sysfs trees with a fake kernel.

#[allow(dead_code, unused_imports)]
#[path = "../src/host/mod.rs"]
mod host;
#[allow(dead_code)]
mod host_support;

use host::hugepages::HugepageSize;
use host::pci::{bind_vfio, check_group, enable_vfs, normalize_addr, vf_address};
use host::prepare::{prepare, Plan};
use host::sizing::Budget;
use host::{Changes, HostError};
use host_support::{w, FakeKernel, Tree};

const PF: &str = "0000:03:00.0";
const VF0: &str = "0000:03:00.1";
const VF1: &str = "0000:03:00.2";
const NUMVFS: &str = "/sys/bus/pci/devices/0000:03:00.0/sriov_numvfs";

/// A GPU with 4 possible VFs at offset 1, stride 1, driven by `xe`, plus vfio-pci loaded.
fn gpu_tree() -> Tree {
    let tree = Tree::new();
    tree.sriov_pf(PF, "xe", 4, 1, 1).driver("vfio-pci").group("12", &[PF]);
    tree.file("/dev/vfio/vfio", "");
    tree
}

fn kernel_with_vfs(tree: &Tree) -> FakeKernel<'_> {
    let mut kernel = FakeKernel::new(tree);
    kernel.vf_addrs.insert(PF.into(), vec![VF0.into(), VF1.into()]);
    kernel.vf_group.insert(VF0.into(), "13".into());
    kernel.vf_group.insert(VF1.into(), "14".into());
    kernel
}

fn run<T>(
    kernel: &FakeKernel<'_>,
    dry_run: bool,
    f: impl FnOnce(&mut Changes<'_>) -> T,
) -> (T, String) {
    let mut out = Vec::new();
    let result = f(&mut Changes::new(kernel, dry_run, true, &mut out));
    (result, String::from_utf8(out).unwrap())
}

#[test]
fn addresses_are_normalised_and_checked() {
    assert_eq!(normalize_addr("03:00.0").unwrap(), "0000:03:00.0");
    assert_eq!(normalize_addr(" 0000:AF:1F.7 ").unwrap(), "0000:af:1f.7");
    for bad in
        ["", "3:00.0", "0000:03:00", "0000:03:20.0", "0000:03:00.8", "zz:00.0", "0000:03:00.0.1"]
    {
        let err = normalize_addr(bad).unwrap_err();
        assert!(matches!(err, HostError::BadAddress(_)), "{bad}: {err:?}");
        assert!(err.to_string().contains("lspci -D"));
    }
}

#[test]
fn enables_vfs_with_one_write() {
    let tree = gpu_tree();
    let kernel = kernel_with_vfs(&tree);
    let (r, out) = run(&kernel, false, |c| enable_vfs(c, PF, 2));
    r.unwrap();
    assert_eq!(kernel.writes(), w(&[(NUMVFS, "2")]));
    assert!(out.contains("[change] echo 2 >"), "{out}");
    assert_eq!(vf_address(&kernel, PF, 1).unwrap(), VF1);
}

#[test]
fn more_vfs_than_the_device_has_is_refused() {
    let tree = gpu_tree();
    let kernel = kernel_with_vfs(&tree);
    let (r, _) = run(&kernel, false, |c| enable_vfs(c, PF, 5));
    let err = r.unwrap_err();
    assert!(matches!(err, HostError::TooManyVfs { total: 4, wanted: 5, .. }), "{err:?}");
    assert!(err.to_string().contains("--vfs 4"));
    assert!(kernel.writes().is_empty());
}

#[test]
fn existing_vfs_are_kept_or_reported() {
    let tree = gpu_tree();
    tree.file(NUMVFS, "2\n");
    let kernel = kernel_with_vfs(&tree);
    let (r, out) = run(&kernel, false, |c| enable_vfs(c, PF, 1));
    r.unwrap();
    assert!(out.contains("2 SR-IOV VFs enabled"), "{out}");
    let (r, _) = run(&kernel, false, |c| enable_vfs(c, PF, 3));
    let err = r.unwrap_err();
    assert!(matches!(err, HostError::VfsInUse { current: 2, wanted: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("echo 0 | sudo tee"), "{err}");
    assert!(kernel.writes().is_empty());
}

#[test]
fn devices_without_sriov_or_missing_are_named() {
    let tree = gpu_tree();
    tree.device("0000:00:02.0", Some("i915"), "0x030000");
    let kernel = kernel_with_vfs(&tree);
    let (r, _) = run(&kernel, false, |c| enable_vfs(c, "0000:00:02.0", 1));
    assert!(matches!(r.unwrap_err(), HostError::NoSriov { .. }));
    let (r, _) = run(&kernel, false, |c| enable_vfs(c, "0000:09:00.0", 1));
    assert!(matches!(r.unwrap_err(), HostError::NoDevice { .. }));
}

#[test]
fn vf_addresses_follow_offset_and_stride_before_the_vfs_exist() {
    let tree = Tree::new();
    tree.sriov_pf("0000:4d:00.0", "xe", 16, 8, 1);
    let kernel = FakeKernel::new(&tree);
    assert_eq!(vf_address(&kernel, "0000:4d:00.0", 0).unwrap(), "0000:4d:01.0");
    assert_eq!(vf_address(&kernel, "0000:4d:00.0", 10).unwrap(), "0000:4d:02.2");
    tree.file("/sys/bus/pci/devices/0000:4d:00.0/sriov_stride", "2\n");
    // Routing IDs past the bus's 256 functions carry into the next bus.
    assert_eq!(vf_address(&kernel, "0000:4d:00.0", 130).unwrap(), "0000:4e:01.4");
}

#[test]
fn binds_a_vf_with_override_unbind_and_probe() {
    let tree = gpu_tree();
    tree.device(VF0, Some("xe"), "0x030000").group("13", &[VF0]);
    let kernel = FakeKernel::new(&tree);
    let (r, out) = run(&kernel, false, |c| bind_vfio(c, VF0, None));
    r.unwrap();
    assert_eq!(
        kernel.writes(),
        w(&[
            ("/sys/bus/pci/devices/0000:03:00.1/driver_override", "vfio-pci"),
            ("/sys/bus/pci/drivers/xe/unbind", VF0),
            ("/sys/bus/pci/drivers_probe", VF0),
        ])
    );
    assert!(out.contains("now bound to vfio-pci"), "{out}");
    // Binding again changes nothing.
    let (r, _) = run(&kernel, false, |c| bind_vfio(c, VF0, None));
    r.unwrap();
    assert_eq!(kernel.writes().len(), 3);
}

#[test]
fn an_unbound_device_is_only_overridden_and_probed() {
    let tree = gpu_tree();
    tree.device(VF0, None, "0x030000");
    let kernel = FakeKernel::new(&tree);
    run(&kernel, false, |c| bind_vfio(c, VF0, None)).0.unwrap();
    let paths: Vec<String> = kernel.writes().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        ["/sys/bus/pci/devices/0000:03:00.1/driver_override", "/sys/bus/pci/drivers_probe"]
    );
}

#[test]
fn a_bind_that_does_not_take_is_an_error() {
    let tree = gpu_tree();
    tree.device(VF0, Some("xe"), "0x030000");
    let mut kernel = FakeKernel::new(&tree);
    kernel.vfio_binds = false;
    let err = run(&kernel, false, |c| bind_vfio(c, VF0, None)).0.unwrap_err();
    assert!(
        matches!(&err, HostError::BindFailed { driver, .. } if driver == "no driver"),
        "{err:?}"
    );
    assert!(err.to_string().contains("intel_iommu=on"), "{err}");
}

#[test]
fn binding_needs_vfio_pci_loaded() {
    let tree = Tree::new();
    tree.device(VF0, Some("xe"), "0x030000");
    let kernel = FakeKernel::new(&tree);
    let err = run(&kernel, false, |c| bind_vfio(c, VF0, None)).0.unwrap_err();
    assert!(matches!(err, HostError::NoVfioPci { .. }), "{err:?}");
    assert!(err.to_string().contains("modprobe vfio-pci"));
    assert!(kernel.writes().is_empty());
}

#[test]
fn groups_with_bridges_and_vfio_devices_are_viable() {
    let tree = gpu_tree();
    tree.device(VF0, Some("vfio-pci"), "0x030000")
        .device("0000:00:01.0", Some("pcieport"), "0x060400")
        .device("0000:02:00.0", Some("acme-bridge"), "0x060400")
        .device("0000:03:00.3", None, "0x040300")
        .device("0000:03:00.4", Some("vfio-pci"), "0x040300")
        .group("7", &[VF0, "0000:00:01.0", "0000:02:00.0", "0000:03:00.3", "0000:03:00.4"]);
    let kernel = FakeKernel::new(&tree);
    let group = check_group(&kernel, VF0).unwrap();
    assert_eq!(group.number, "7");
    assert_eq!(group.devices.len(), 5);
}

#[test]
fn a_group_with_a_host_driver_is_not_viable() {
    let tree = gpu_tree();
    tree.device(VF0, Some("vfio-pci"), "0x030000")
        .device("0000:03:00.3", Some("snd_hda_intel"), "0x040300")
        .group("7", &[VF0, "0000:03:00.3"]);
    let kernel = FakeKernel::new(&tree);
    let err = check_group(&kernel, VF0).unwrap_err();
    assert!(matches!(&err, HostError::GroupNotViable { group, .. } if group == "7"), "{err:?}");
    assert!(err.to_string().contains("0000:03:00.3 (snd_hda_intel)"), "{err}");
}

#[test]
fn a_device_without_a_group_needs_the_iommu() {
    let tree = gpu_tree();
    tree.device(VF0, Some("vfio-pci"), "0x030000");
    let kernel = FakeKernel::new(&tree);
    let err = check_group(&kernel, VF0).unwrap_err();
    assert!(matches!(err, HostError::NoIommuGroup { .. }));
    assert!(err.to_string().contains("intel_iommu=on iommu=pt"));
}

fn plan(tree: &Tree, gpu: Option<&str>, vf: Option<&str>) -> Plan {
    tree.file("/pack/weights.safetensors", &"w".repeat(3 << 20));
    let budget =
        Budget::compute(&tree.real("/pack"), 16, kore_engine::state::KvPrecision::default())
            .unwrap();
    Plan {
        budget,
        hugepage_size: HugepageSize::M2,
        gpu: gpu.map(String::from),
        vfs: 2,
        vf: vf.map(String::from),
    }
}

#[test]
fn setup_reserves_enables_binds_and_checks_in_order() {
    let tree = gpu_tree();
    tree.pool(2048, 0, 0, 0);
    tree.file("/dev/vfio/13", "");
    let kernel = kernel_with_vfs(&tree);
    let plan = plan(&tree, Some("03:00.0"), None);
    let pages = plan.budget.total().div_ceil(2 << 20).to_string();
    let (r, out) = run(&kernel, false, |c| prepare(c, &plan));
    r.unwrap();
    assert_eq!(
        kernel.writes(),
        w(&[
            ("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", &pages),
            (NUMVFS, "2"),
            ("/sys/bus/pci/devices/0000:03:00.1/driver_override", "vfio-pci"),
            ("/sys/bus/pci/drivers/xe/unbind", VF0),
            ("/sys/bus/pci/drivers_probe", VF0),
        ])
    );
    assert!(out.contains("IOMMU group 13 of 0000:03:00.1 is viable"), "{out}");
    assert!(out.contains("vf = \"0000:03:00.1\""), "{out}");
    assert!(out.contains("done: 5 change(s) made"), "{out}");
    // A second run finds everything in place.
    let before = kernel.writes().len();
    let (r, out) = run(&kernel, false, |c| prepare(c, &plan));
    r.unwrap();
    assert_eq!(kernel.writes().len(), before, "{:?}\n{out}", kernel.writes());
    assert!(out.contains("nothing to change"), "{out}");
}

#[test]
fn setup_dry_run_plans_the_vf_before_it_exists() {
    let tree = gpu_tree();
    tree.pool(2048, 0, 0, 0);
    let kernel = kernel_with_vfs(&tree);
    let plan = plan(&tree, Some(PF), None);
    let (r, out) = run(&kernel, true, |c| prepare(c, &plan));
    r.unwrap();
    assert!(kernel.writes().is_empty());
    assert_eq!(tree.read(NUMVFS), "0\n");
    let root = tree.root().display().to_string();
    for line in [
        format!("[dry-run] echo 2 > {root}{NUMVFS}"),
        format!("[dry-run] echo vfio-pci > {root}/sys/bus/pci/devices/{VF0}/driver_override"),
        format!("[dry-run] echo {VF0} > {root}/sys/bus/pci/drivers/xe/unbind"),
        format!("[dry-run] echo {VF0} > {root}/sys/bus/pci/drivers_probe"),
        "dry run: 5 change(s) would be made".to_string(),
    ] {
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn setup_stops_at_a_non_viable_group() {
    let tree = gpu_tree();
    tree.pool(2048, 0, 0, 0);
    let mut kernel = kernel_with_vfs(&tree);
    // The VF lands in the PF's group, whose PF stays bound to xe.
    kernel.vf_group.insert(VF0.into(), "12".into());
    let plan = plan(&tree, Some(PF), None);
    let err = run(&kernel, false, |c| prepare(c, &plan)).0.unwrap_err();
    assert!(err.to_string().contains("0000:03:00.0 (xe)"), "{err}");
}

#[test]
fn setup_without_root_changes_nothing() {
    let tree = gpu_tree();
    tree.pool(2048, 0, 0, 0);
    let kernel = kernel_with_vfs(&tree);
    let plan = plan(&tree, Some(PF), None);
    let mut out = Vec::new();
    let err = prepare(&mut Changes::new(&kernel, false, false, &mut out), &plan).unwrap_err();
    assert!(matches!(err, HostError::NotRoot { .. }), "{err:?}");
    assert!(kernel.writes().is_empty());
}
