//! `kore-launch setup [--dry-run]`: lets group `kvm` open /dev/kvm (now and after a
//! reboot, `host::kvm_access`) and adds the user who ran `sudo` to it, reserves the
//! hugepages the pack, context and VMM need, and optionally prepares a GPU VF for
//! VFIO (see `host::prepare`).

use crate::cli::SetupArgs;
use crate::config::{self, Overrides};
use crate::error::{LaunchError, Result};
use crate::host::changes::running_as_root;
use crate::host::kvm_access;
use crate::host::prepare::{prepare, Plan};
use crate::host::{Changes, HostError, SysRoot};

/// Runs `setup`.
pub fn run(args: &SetupArgs) -> Result<()> {
    let overrides = Overrides {
        model: args.model.clone(),
        memory: args.memory,
        hugepage_size: args.hugepage_size,
        context: args.context,
        ..Overrides::default()
    };
    let settings = config::effective(&overrides)?;
    let model = crate::model::effective_path(&settings)?;
    let budget = crate::appliance::budget(&model, &settings).map_err(host_error)?;
    // An explicit --vf wins; with --gpu the first new VF; otherwise the configured `vf`.
    let vf = match (&config::vf_flag(), &args.gpu) {
        (Some(_), _) | (None, None) => settings.vf.clone(),
        (None, Some(_)) => None,
    };
    let plan = Plan {
        budget,
        hugepage_size: settings.hugepage_size,
        gpu: args.gpu.clone(),
        vfs: args.vfs,
        vf,
    };
    let root = sysroot();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut changes = Changes::new(&root, args.dry_run, running_as_root(), &mut out);
    kvm_access::grant(&mut changes).map_err(host_error)?;
    kvm_group(&mut changes).map_err(host_error)?;
    prepare(&mut changes, &plan).map_err(host_error)
}

/// Lets the user who ran `sudo kore-launch setup` open /dev/kvm (group `kvm`), so
/// every command but `setup` runs without root.
fn kvm_group(changes: &mut Changes<'_>) -> std::result::Result<(), HostError> {
    let user = crate::env::sudo_user();
    let Some(user) = user else {
        return changes.note(
            "to run the appliance as a user, add it to group kvm (`sudo usermod -aG kvm USER`, \
             then log in again); `sudo kore-launch setup` run by that user does it",
        );
    };
    let groups = std::process::Command::new("id").args(["-nG", &user]).output();
    let in_kvm = groups
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().any(|g| g == "kvm"))
        .unwrap_or(false);
    if in_kvm {
        return changes
            .note(&format!("[ok] {user} is in group kvm (/dev/kvm usable without root)"));
    }
    changes.command(
        "usermod",
        &["-aG", "kvm", &user],
        &format!("lets {user} open /dev/kvm; takes effect at {user}'s next login"),
    )
}

/// The filesystem root for host files: `/`, or `KORE_SYSROOT` (for tests and chroots).
pub fn sysroot() -> SysRoot {
    match crate::env::path("KORE_SYSROOT") {
        Some(base) => SysRoot::new(base),
        None => SysRoot::default(),
    }
}

/// Maps a host error to the launcher's: bad input stays a usage error.
pub fn host_error(err: HostError) -> LaunchError {
    match err {
        HostError::BadAddress(_) => LaunchError::Usage(err.to_string()),
        HostError::Pack { .. } => LaunchError::Model(err.to_string()),
        other => LaunchError::Host(other.to_string()),
    }
}
