//! The checks behind `kore-launch doctor`: KVM, CPU features, hugepages,
//! memory, IOMMU, vfio, vsock and the configured GPU VF. Each check says what
//! it found and, when something is wrong, the exact fix.

use super::cpu::CpuFeatures;
use super::hugepages::{self, HugepageSize};
use super::kvm::{KvmProbe, KVM_API_VERSION};
use super::kvm_access::KvmAccess;
use super::pci;
use super::sizing::{mib, Budget};
use super::Sys;
use serde::Serialize;
use std::io::Write;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but slower or without an optional feature.
    Warn,
    /// The appliance cannot boot until this is fixed.
    Fail,
}

/// One line of the doctor's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name ("kvm", "hugepages", ...).
    pub name: String,
    /// ok, warn or fail.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// The command or setting that fixes it (null when ok).
    pub fix: Option<String>,
}

impl Check {
    /// A check with a status, detail and optional fix.
    pub fn new(
        name: &str,
        status: Status,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Check {
        Check { name: name.to_string(), status, detail: detail.into(), fix }
    }
}

/// Everything the checks look at; probes of real hardware are taken by the
/// caller so tests can supply their own.
pub struct Inputs<'a> {
    /// The filesystem (real or fake).
    pub sys: &'a dyn Sys,
    /// Result of opening /dev/kvm.
    pub kvm: KvmProbe,
    /// Who may open /dev/kvm, and whether a udev rule keeps it so.
    pub kvm_access: KvmAccess,
    /// The CPU's features.
    pub cpu: CpuFeatures,
    /// The configured hugepage size.
    pub hugepage_size: HugepageSize,
    /// The memory the appliance needs, or why it could not be computed.
    pub budget: Result<Budget, String>,
    /// The configured VF to pass through, if any.
    pub vf: Option<String>,
    /// The CPU level the VMM presents to the guest.
    pub guest_cpu: kore_vmm::GuestCpu,
}

/// The doctor's findings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// True when no check failed.
    pub ok: bool,
    /// Every check, in order.
    pub checks: Vec<Check>,
}

impl Report {
    /// Builds a report from checks.
    pub fn new(checks: Vec<Check>) -> Report {
        Report { ok: checks.iter().all(|c| c.status != Status::Fail), checks }
    }

    /// Names of the failed checks.
    pub fn failed(&self) -> Vec<&str> {
        self.checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.as_str()).collect()
    }

    /// Prints the report for people.
    pub fn render(&self, out: &mut dyn Write) -> std::io::Result<()> {
        for check in &self.checks {
            let tag = match check.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            writeln!(out, "[{tag}] {:<10} {}", check.name, check.detail)?;
            if let Some(fix) = &check.fix {
                writeln!(out, "       {:<10} fix: {fix}", "")?;
            }
        }
        Ok(())
    }
}

/// Whether group kvm may open /dev/kvm, now and after a reboot: an ordinary user
/// needs it; root does not, so this is a warning, never a failure.
fn kvm_group(access: &KvmAccess) -> Check {
    let fix = Some("`sudo kore-launch setup` (group kvm, mode 0660, a udev rule)".to_string());
    let warn = |detail: String| Check::new("kvm-group", Status::Warn, detail, fix.clone());
    let Some((gid, mode)) = access.node else {
        return Check::new("kvm-group", Status::Warn, "/dev/kvm is missing (see kvm)", None);
    };
    let owner = match access.kvm_gid {
        Some(kvm) if kvm == gid => "group kvm".to_string(),
        _ => format!("gid {gid}"),
    };
    if !access.group_can_open() {
        return warn(format!(
            "/dev/kvm is {owner}, mode {mode:04o}: only root can run the appliance (members of \
             group kvm cannot open it)"
        ));
    }
    match &access.rule {
        None => warn(format!(
            "/dev/kvm is {owner}, mode {mode:04o}, but no udev rule keeps it so: a reboot takes \
             it back"
        )),
        Some(rule) => Check::new(
            "kvm-group",
            Status::Ok,
            format!("/dev/kvm is {owner}, mode {mode:04o}, kept so by {rule}"),
            None,
        ),
    }
}

/// Runs every check.
pub fn run(inputs: &Inputs<'_>) -> Report {
    let meminfo = MemInfo::read(inputs.sys);
    let mut checks = vec![
        kvm(inputs.sys, &inputs.kvm),
        kvm_group(&inputs.kvm_access),
        cpu(&inputs.cpu, inputs.guest_cpu),
        hugepages(inputs, &meminfo),
        memory(inputs, &meminfo),
        iommu(inputs.sys),
        vfio(inputs.sys),
        vsock(inputs.sys),
    ];
    if let Some(vf) = &inputs.vf {
        checks.push(gpu(inputs.sys, vf));
    }
    Report::new(checks)
}

fn kvm(sys: &dyn Sys, probe: &KvmProbe) -> Check {
    let fail =
        |detail: String, fix: &str| Check::new("kvm", Status::Fail, detail, Some(fix.to_string()));
    match probe {
        KvmProbe::Missing => fail(
            "/dev/kvm is missing".into(),
            "enable VT-x/AMD-V in the firmware setup and load KVM: `sudo modprobe kvm_intel` (or `kvm_amd`); inside a VM, enable nested virtualisation on its host",
        ),
        KvmProbe::Denied => fail(
            "/dev/kvm exists but this user may not open it".into(),
            "`sudo kore-launch setup` (lets group kvm open /dev/kvm and adds you to it, as `usermod -aG kvm $USER`), then log in again; or run as root",
        ),
        KvmProbe::NotKvm(err) => fail(
            format!("/dev/kvm does not answer KVM_GET_API_VERSION: {err}"),
            "check `lsmod | grep kvm` and `dmesg | grep -i kvm`; reload with `sudo modprobe -r kvm_intel && sudo modprobe kvm_intel`",
        ),
        KvmProbe::Api(v) if *v != KVM_API_VERSION => fail(
            format!("/dev/kvm reports KVM API version {v}, expected {KVM_API_VERSION}"),
            "use a Linux kernel with the standard KVM API",
        ),
        KvmProbe::Api(v) => Check::new("kvm", Status::Ok, format!("/dev/kvm opened, KVM API version {v}{}", nested_note(sys)), None),
    }
}

/// Says whether this host is itself a VM, and KVM's nested setting.
fn nested_note(sys: &dyn Sys) -> String {
    let mut note = String::new();
    let in_vm = sys
        .read("/proc/cpuinfo")
        .map(|info| {
            info.lines()
                .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"))
        })
        .unwrap_or(false);
    if in_vm {
        note.push_str("; this host is itself a VM, so /dev/kvm is nested (on PVM-style nested hypervisors guest ring 0 is emulated and slow; Kore keeps ring-0 work minimal)");
    }
    for module in ["kvm_intel", "kvm_amd"] {
        if let Ok(value) = sys.read(&format!("/sys/module/{module}/parameters/nested")) {
            note.push_str(&format!("; {module} nested={}", value.trim()));
        }
    }
    note
}

fn cpu(cpu: &CpuFeatures, level: kore_vmm::GuestCpu) -> Check {
    if !cpu.x86_64 {
        return Check::new(
            "cpu",
            Status::Fail,
            "not an x86-64 CPU",
            Some("run Kore on an x86-64 host".into()),
        );
    }
    let missing = cpu.missing();
    let present: Vec<&str> = cpu.list().iter().filter(|(_, p)| *p).map(|(n, _)| *n).collect();
    let paths = format!(
        "kernels: {} natively, {} in the guest (guest CPU {level})",
        cpu.kernel_path(kore_vmm::GuestCpu::Host),
        cpu.kernel_path(level)
    );
    if missing.is_empty() {
        return Check::new("cpu", Status::Ok, format!("{}; {paths}", present.join(" ")), None);
    }
    let fix = "use a CPU with AVX-512 VNNI/BF16 (Intel Sapphire Rapids or later, AMD Zen 4 or later); inside a VM, pass the host CPU model through (`-cpu host`, libvirt `host-passthrough`)".to_string();
    let speed = if cpu.avx2 && cpu.fma {
        "the engine uses narrower kernels (slower)"
    } else {
        "the engine uses scalar kernels (much slower)"
    };
    Check::new(
        "cpu",
        Status::Warn,
        format!("missing {}: {speed}; {paths}", missing.join(" ")),
        Some(fix),
    )
}

/// The lines of /proc/meminfo we use, in bytes.
#[derive(Debug, Default, Clone, Copy)]
struct MemInfo {
    total: Option<u64>,
    available: Option<u64>,
}

impl MemInfo {
    fn read(sys: &dyn Sys) -> MemInfo {
        let text = sys.read("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix(':')?;
                let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
                Some(kb * 1024)
            })
        };
        MemInfo { total: field("MemTotal"), available: field("MemAvailable") }
    }
}

fn pools_summary(sys: &dyn Sys) -> String {
    [HugepageSize::M2, HugepageSize::G1]
        .iter()
        .map(|&size| match hugepages::read_pool(sys, size) {
            Ok(Some(p)) => {
                format!("{} pool {} pages ({} free)", size.label(), p.total, p.available())
            }
            Ok(None) => format!("no {} pool", size.label()),
            Err(e) => format!("{} pool unreadable ({e})", size.label()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn hugepages(inputs: &Inputs<'_>, meminfo: &MemInfo) -> Check {
    let sys = inputs.sys;
    let size = inputs.hugepage_size;
    let pools = pools_summary(sys);
    if size == HugepageSize::Off {
        return Check::new(
            "hugepages",
            Status::Warn,
            format!("hugepage_size = off: guest memory on 4 KiB pages (slower); {pools}"),
            Some("set `hugepage_size = \"2M\"` in launch.toml (or KORE_HUGEPAGE_SIZE=2M)".into()),
        );
    }
    let pool = match hugepages::read_pool(sys, size) {
        Ok(Some(pool)) => pool,
        Ok(None) => {
            return Check::new(
                "hugepages",
                Status::Fail,
                format!("no {} hugepage pool; {pools}", size.label()),
                Some(hugepages::no_pool_fix(size).into()),
            )
        }
        Err(e) => {
            return Check::new(
                "hugepages",
                Status::Fail,
                e.to_string(),
                Some("run as root or check /sys is mounted".into()),
            )
        }
    };
    let budget = match &inputs.budget {
        Ok(budget) => budget,
        Err(why) => {
            return Check::new(
                "hugepages",
                Status::Warn,
                format!("{pools}; cannot tell how many are needed: {why}"),
                Some("pass `--model PATH` with an existing pack".into()),
            )
        }
    };
    let page = size.bytes().unwrap_or(1);
    let needed = hugepages::pages_for(budget.guest_bytes_for(size), size);
    let have = pool.available();
    if have >= needed {
        return Check::new(
            "hugepages",
            Status::Ok,
            format!("{needed} x {} needed, {have} available; {pools}", size.label()),
            None,
        );
    }
    let missing_bytes = (needed - have) * page;
    let detail = format!(
        "{needed} x {} needed ({}), {have} available; {pools}",
        size.label(),
        mib(needed * page)
    );
    match meminfo.available {
        Some(avail) if avail < missing_bytes => Check::new(
            "hugepages",
            Status::Fail,
            format!("{detail}; only {} of free memory to take them from", mib(avail)),
            Some(format!(
                "free memory (stop other VMs or services), use a smaller pack or a shorter `context`, or reserve at boot with the kernel parameters `{}`",
                size.boot_param(pool.total + needed - have)
            )),
        ),
        _ => Check::new("hugepages", Status::Warn, detail, Some("`sudo kore-launch setup` reserves them (it runs automatically before boot when possible)".into())),
    }
}

fn memory(inputs: &Inputs<'_>, meminfo: &MemInfo) -> Check {
    let (Some(total), Some(available)) = (meminfo.total, meminfo.available) else {
        return Check::new(
            "memory",
            Status::Warn,
            "cannot read MemTotal/MemAvailable from /proc/meminfo",
            Some("mount procfs on /proc".into()),
        );
    };
    let seen = format!("{} total, {} available", mib(total), mib(available));
    let Ok(budget) = &inputs.budget else {
        return Check::new("memory", Status::Ok, seen, None);
    };
    let need = budget.guest_bytes();
    let detail = format!(
        "{seen}; the appliance needs {} ({} at context {})",
        mib(need),
        budget.pack.display(),
        budget.context
    );
    if total < need {
        let mut fix = "use a smaller pack (`--model`) or a shorter context (`context` in launch.toml), or add RAM".to_string();
        if budget.shape.is_some_and(|s| s.moe_chunk_bytes > 0) {
            fix += "; this MoE pack's guest holds every expert: `--native` maps the pack instead, or `pack synth --layers N` cuts a synthetic one";
        }
        return Check::new("memory", Status::Fail, detail, Some(fix));
    }
    if inputs.hugepage_size == HugepageSize::Off && available < need {
        return Check::new(
            "memory",
            Status::Warn,
            detail,
            Some("free memory: stop other VMs or services".into()),
        );
    }
    Check::new("memory", Status::Ok, detail, None)
}

const IOMMU_FIX: &str = "add `intel_iommu=on iommu=pt` (Intel) or `amd_iommu=on iommu=pt` (AMD) to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, run `sudo update-grub` and reboot; enable VT-d / AMD-Vi in the firmware setup";

fn iommu(sys: &dyn Sys) -> Check {
    let units = sys.list("/sys/class/iommu");
    let groups = sys.list("/sys/kernel/iommu_groups").len();
    let cmdline = sys.read("/proc/cmdline").unwrap_or_default();
    let flags: Vec<&str> = cmdline
        .split_whitespace()
        .filter(|w| {
            w.starts_with("intel_iommu") || w.starts_with("amd_iommu") || w.starts_with("iommu=")
        })
        .collect();
    let flags = if flags.is_empty() { "none".to_string() } else { flags.join(" ") };
    let detail = format!(
        "{} IOMMU unit(s) [{}], {groups} IOMMU group(s), kernel command line IOMMU flags: {flags}",
        units.len(),
        units.join(" ")
    );
    if groups > 0 {
        return Check::new("iommu", Status::Ok, detail, None);
    }
    let asked = cmdline.contains("intel_iommu=on") || cmdline.contains("amd_iommu=on");
    let fix = if asked {
        "the kernel was asked for the IOMMU but none came up: enable VT-d / AMD-Vi in the firmware setup"
    } else {
        IOMMU_FIX
    };
    Check::new(
        "iommu",
        Status::Warn,
        format!("{detail}: no GPU passthrough (the appliance runs on the CPU)"),
        Some(fix.to_string()),
    )
}

fn vfio(sys: &dyn Sys) -> Check {
    let container = sys.exists("/dev/vfio/vfio");
    let driver = sys.exists("/sys/bus/pci/drivers/vfio-pci");
    let detail = format!(
        "/dev/vfio/vfio {}, vfio-pci driver {}",
        if container { "present" } else { "missing" },
        if driver { "loaded" } else { "not loaded" }
    );
    if container && driver {
        return Check::new("vfio", Status::Ok, detail, None);
    }
    Check::new(
        "vfio",
        Status::Warn,
        format!("{detail}: no GPU passthrough (the appliance runs on the CPU)"),
        Some("`sudo modprobe vfio-pci`; to load it at boot: `echo vfio-pci | sudo tee /etc/modules-load.d/vfio-pci.conf`".into()),
    )
}

fn vsock(sys: &dyn Sys) -> Check {
    let vhost = if sys.exists("/dev/vhost-vsock") { "present" } else { "absent" };
    Check::new(
        "vsock",
        Status::Ok,
        format!("Kore's virtio-vsock device runs in its own VMM over a Unix socket: /dev/vhost-vsock is not needed ({vhost} here)"),
        None,
    )
}

fn gpu(sys: &dyn Sys, vf: &str) -> Check {
    let warn = |detail: String, fix: String| Check::new("gpu", Status::Warn, detail, Some(fix));
    let setup_fix =
        format!("`sudo kore-launch setup --vf {vf}` (or `--gpu PF` to create the VF first)");
    if !sys.exists(&pci::device_dir(vf)) {
        return warn(format!("configured VF {vf} does not exist (not yet created?)"), setup_fix);
    }
    let driver = pci::driver_of(sys, vf);
    if driver.as_deref() != Some("vfio-pci") {
        let bound = driver.unwrap_or_else(|| "no driver".into());
        return warn(format!("VF {vf} is bound to {bound}, not vfio-pci"), setup_fix);
    }
    match pci::check_group(sys, vf) {
        Ok(group) => {
            let node = format!("/dev/vfio/{}", group.number);
            if !sys.exists(&node) {
                return warn(
                    format!("VF {vf} in IOMMU group {} but {node} is missing", group.number),
                    "`sudo modprobe vfio-pci` and rebind: ".to_string() + &setup_fix,
                );
            }
            Check::new(
                "gpu",
                Status::Ok,
                format!("VF {vf} bound to vfio-pci, IOMMU group {} viable ({node})", group.number),
                None,
            )
        }
        Err(e) => warn(format!("VF {vf}: {e}"), setup_fix),
    }
}
