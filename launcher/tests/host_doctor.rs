//! `doctor`'s checks against fake trees, with the KVM and CPU probes supplied.

#[allow(dead_code, unused_imports)]
#[path = "../src/host/mod.rs"]
mod host;
#[allow(dead_code)]
mod host_support;

use host::checks::{run, Check, Inputs, Report, Status};
use host::cpu::CpuFeatures;
use host::hugepages::HugepageSize;
use host::kvm::{probe, KvmProbe};
use host::sizing::Budget;
use host::SysRoot;
use host_support::Tree;

const GIB: u64 = 1 << 30;

fn all_cpu() -> CpuFeatures {
    CpuFeatures {
        x86_64: true,
        avx512f: true,
        avx512bw: true,
        avx512vl: true,
        avx512vnni: true,
        avx512bf16: true,
        avx512vbmi: true,
        avx2: true,
        fma: true,
    }
}

/// A healthy host: 16 GiB, 600 free 2 MiB pages, IOMMU on, vfio loaded.
fn healthy() -> Tree {
    let tree = Tree::new();
    tree.pool(2048, 600, 600, 0).pool(1048576, 0, 0, 0);
    tree.file(
        "/proc/meminfo",
        "MemTotal:       16777216 kB\nMemFree:  1000 kB\nMemAvailable:   8388608 kB\n",
    );
    tree.file("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n");
    tree.file("/proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu vme avx2 hypervisor\n");
    tree.dir("/sys/class/iommu/dmar0")
        .dir("/sys/kernel/iommu_groups/0")
        .dir("/sys/kernel/iommu_groups/1");
    tree.file("/dev/vfio/vfio", "").driver("vfio-pci");
    tree.file("/pack/weights.safetensors", &"w".repeat(1 << 20));
    // /dev/kvm for group kvm (a file of ours: its gid is ours, named kvm here), kept by udev.
    // SAFETY: getgid has no preconditions.
    let gid = unsafe { libc::getgid() };
    tree.file("/etc/group", &format!("root:x:0:\nkvm:x:{gid}:\n"));
    tree.file(
        "/usr/lib/udev/rules.d/50-udev-default.rules",
        "KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\"\n",
    );
    tree.file("/dev/kvm", "");
    chmod(&tree, "/dev/kvm", 0o660);
    tree
}

fn chmod(tree: &Tree, path: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tree.real(path), std::fs::Permissions::from_mode(mode)).unwrap();
}

fn check<'r>(report: &'r Report, name: &str) -> &'r Check {
    report.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name}"))
}

fn doctor(
    tree: &Tree,
    kvm: KvmProbe,
    cpu: CpuFeatures,
    size: HugepageSize,
    vf: Option<&str>,
) -> Report {
    let root = SysRoot::new(tree.root());
    let budget =
        Budget::compute(&tree.real("/pack"), 1024, kore_engine::state::KvPrecision::default())
            .map_err(|e| e.to_string());
    let vf = vf.map(String::from);
    let guest_cpu = kore_vmm::GuestCpu::Host;
    let kvm_access = host::kvm_access::inspect(&root);
    run(&Inputs { sys: &root, kvm, kvm_access, cpu, hugepage_size: size, budget, vf, guest_cpu })
}

#[test]
fn a_healthy_host_passes_every_check() {
    let tree = healthy();
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    for c in &report.checks {
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(c.fix, None);
    }
    assert!(report.ok);
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    let all = ["kvm", "kvm-group", "cpu", "hugepages", "memory", "iommu", "vfio", "vsock"];
    assert_eq!(names, all);
    assert!(check(&report, "kvm").detail.contains("this host is itself a VM"));
    assert!(check(&report, "vsock").detail.contains("/dev/vhost-vsock is not needed"));
}

#[test]
fn kvm_problems_fail_with_their_fix() {
    let tree = healthy();
    let cases = [
        (KvmProbe::Missing, "modprobe kvm_intel"),
        (KvmProbe::Denied, "usermod -aG kvm"),
        (KvmProbe::NotKvm("Inappropriate ioctl".into()), "lsmod | grep kvm"),
        (KvmProbe::Api(11), "standard KVM API"),
    ];
    for (probe, fix) in cases {
        let report = doctor(&tree, probe.clone(), all_cpu(), HugepageSize::M2, None);
        let kvm = check(&report, "kvm");
        assert_eq!(kvm.status, Status::Fail, "{probe:?}");
        assert!(kvm.fix.as_deref().unwrap().contains(fix), "{kvm:?}");
        assert!(!report.ok);
        assert_eq!(report.failed(), ["kvm"]);
    }
}

#[test]
fn a_root_only_kvm_node_or_a_missing_udev_rule_is_a_warning_naming_setup() {
    let tree = healthy();
    chmod(&tree, "/dev/kvm", 0o600);
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    let c = check(&report, "kvm-group");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.detail.contains("mode 0600") && c.detail.contains("only root"), "{c:?}");
    assert!(c.fix.as_deref().unwrap().contains("sudo kore-launch setup"), "{c:?}");
    assert!(report.ok, "root can still boot: a warning, not a failure");

    chmod(&tree, "/dev/kvm", 0o660);
    std::fs::remove_file(tree.real("/usr/lib/udev/rules.d/50-udev-default.rules")).unwrap();
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    let c = check(&report, "kvm-group");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.detail.contains("no udev rule") && c.detail.contains("reboot"), "{c:?}");
}

#[test]
fn probing_a_file_that_is_not_kvm() {
    let tree = Tree::new();
    assert_eq!(probe(&SysRoot::new(tree.root())), KvmProbe::Missing);
    tree.file("/dev/kvm", "");
    assert!(matches!(probe(&SysRoot::new(tree.root())), KvmProbe::NotKvm(_)));
}

#[test]
fn missing_cpu_features_warn() {
    let tree = healthy();
    let cpu = CpuFeatures { avx512bf16: false, avx512vbmi: false, ..all_cpu() };
    let report = doctor(&tree, KvmProbe::Api(12), cpu, HugepageSize::M2, None);
    let c = check(&report, "cpu");
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.starts_with("missing avx512bf16 avx512vbmi"), "{c:?}");
    assert!(report.ok);
    let report = doctor(&tree, KvmProbe::Api(12), CpuFeatures::default(), HugepageSize::M2, None);
    assert_eq!(check(&report, "cpu").status, Status::Fail);
}

#[test]
fn the_cpu_check_names_the_kernel_path_at_each_guest_level() {
    use kore_vmm::GuestCpu;
    let cpu = all_cpu();
    assert_eq!(cpu.kernel_path(GuestCpu::Host), "avx512vnni");
    assert_eq!(cpu.kernel_path(GuestCpu::X86_64V3), "avx2");
    assert_eq!(cpu.kernel_path(GuestCpu::X86_64V2), "generic");
    let laptop = CpuFeatures { avx512f: false, avx512vnni: false, ..all_cpu() };
    assert_eq!(laptop.kernel_path(GuestCpu::Host), "avx2");
    let tree = healthy();
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    let c = check(&report, "cpu");
    assert!(c.detail.contains("avx512vnni natively, avx512vnni in the guest"), "{c:?}");
}

#[test]
fn hugepages_short_warn_when_setup_can_reserve_them() {
    let tree = healthy();
    tree.pool(2048, 10, 10, 0);
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    let c = check(&report, "hugepages");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.fix.as_deref().unwrap().contains("sudo kore-launch setup"));
    assert!(report.ok);
}

#[test]
fn hugepages_fail_when_memory_cannot_hold_them() {
    let tree = healthy();
    tree.pool(2048, 0, 0, 0);
    tree.file("/proc/meminfo", "MemTotal: 16777216 kB\nMemAvailable: 102400 kB\n");
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    let c = check(&report, "hugepages");
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.fix.as_deref().unwrap().contains("hugepagesz=2M hugepages="), "{c:?}");
    assert_eq!(report.failed(), ["hugepages"]);
}

#[test]
fn a_missing_1g_pool_fails_and_off_warns() {
    let tree = healthy();
    std::fs::remove_dir_all(tree.real("/sys/kernel/mm/hugepages/hugepages-1048576kB")).unwrap();
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::G1, None);
    let c = check(&report, "hugepages");
    assert_eq!(c.status, Status::Fail);
    assert!(c.fix.as_deref().unwrap().contains("2M"));
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::Off, None);
    assert_eq!(check(&report, "hugepages").status, Status::Warn);
}

#[test]
fn too_little_ram_fails_the_memory_check() {
    let tree = healthy();
    tree.file("/proc/meminfo", "MemTotal: 102400 kB\nMemAvailable: 102400 kB\n");
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::Off, None);
    let c = check(&report, "memory");
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.fix.as_deref().unwrap().contains("smaller pack"));
    let _ = GIB;
}

#[test]
fn no_iommu_or_vfio_only_warns() {
    let tree = healthy();
    std::fs::remove_dir_all(tree.real("/sys/kernel/iommu_groups")).unwrap();
    std::fs::remove_dir_all(tree.real("/sys/class/iommu")).unwrap();
    std::fs::remove_dir_all(tree.real("/dev/vfio")).unwrap();
    tree.file("/proc/cmdline", "root=/dev/sda1 quiet\n");
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    let iommu = check(&report, "iommu");
    assert_eq!(iommu.status, Status::Warn);
    assert!(iommu.fix.as_deref().unwrap().contains("intel_iommu=on iommu=pt"));
    let vfio = check(&report, "vfio");
    assert_eq!(vfio.status, Status::Warn);
    assert!(vfio.fix.as_deref().unwrap().contains("modprobe vfio-pci"));
    assert!(report.ok);
    // Asked on the command line but not there: the firmware is the fix.
    tree.file("/proc/cmdline", "root=/dev/sda1 intel_iommu=on\n");
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, None);
    assert!(check(&report, "iommu").fix.as_deref().unwrap().contains("firmware"));
}

#[test]
fn the_configured_vf_is_checked() {
    let tree = healthy();
    let vf = "0000:03:00.1";
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, Some(vf));
    let gpu = check(&report, "gpu");
    assert_eq!(gpu.status, Status::Warn);
    assert!(gpu.fix.as_deref().unwrap().contains("kore-launch setup --vf 0000:03:00.1"));
    tree.device(vf, Some("vfio-pci"), "0x030000").group("13", &[vf]).file("/dev/vfio/13", "");
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, Some(vf));
    let gpu = check(&report, "gpu");
    assert_eq!(gpu.status, Status::Ok, "{gpu:?}");
    tree.device("0000:03:00.3", Some("snd_hda_intel"), "0x040300").group("13", &["0000:03:00.3"]);
    let report = doctor(&tree, KvmProbe::Api(12), all_cpu(), HugepageSize::M2, Some(vf));
    assert!(check(&report, "gpu").detail.contains("not viable"));
}

#[test]
fn the_json_has_the_documented_shape() {
    let tree = healthy();
    let report = doctor(&tree, KvmProbe::Missing, all_cpu(), HugepageSize::M2, None);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["ok"], false);
    let kvm = &json["checks"][0];
    assert_eq!(kvm["name"], "kvm");
    assert_eq!(kvm["status"], "fail");
    assert!(kvm["detail"].as_str().unwrap().contains("missing"));
    assert!(kvm["fix"].is_string());
    assert!(json["checks"][1]["fix"].is_null());
    let mut text = Vec::new();
    report.render(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.starts_with("[FAIL] kvm"), "{text}");
    assert!(text.contains("fix: enable VT-x"), "{text}");
}
