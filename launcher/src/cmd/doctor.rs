//! `kore-launch doctor [--json]`: checks the host (see `host::checks`) and
//! prints each finding with its fix; fails when the appliance cannot boot.

use super::setup::sysroot;
use crate::cli::JsonFlag;
use crate::config::{self, Overrides};
use crate::error::{LaunchError, Result};
use crate::host::checks::{self, Check, Inputs, Report, Status};
use crate::host::cpu::CpuFeatures;
use crate::host::{kvm, kvm_access};
use std::io::Write;

/// Runs `doctor`.
pub fn run(flag: JsonFlag) -> Result<()> {
    let settings = config::effective(&Overrides::default())?;
    let root = sysroot();
    let budget = crate::model::effective_path(&settings)
        .map_err(|e| e.to_string())
        .and_then(|model| crate::appliance::budget(&model, &settings).map_err(|e| e.to_string()));
    let inputs = Inputs {
        sys: &root,
        kvm: kvm::probe(&root),
        kvm_access: kvm_access::inspect(&root),
        cpu: CpuFeatures::detect(),
        hugepage_size: settings.hugepage_size,
        budget,
        vf: settings.vf.clone(),
        guest_cpu: settings.guest_cpu,
    };
    let mut found = checks::run(&inputs);
    let config_detail = match &settings.config_file {
        Some(path) => format!(
            "{} (model {}, context {})",
            path.display(),
            settings.model.display(),
            settings.context
        ),
        None => format!(
            "no config file, defaults (model {}, context {})",
            settings.model.display(),
            settings.context
        ),
    };
    found.checks.insert(0, Check::new("config", Status::Ok, config_detail, None));
    let report = Report::new(found.checks);
    print(&report, flag.json)
        .map_err(|source| LaunchError::Io { path: "standard output".into(), source })?;
    if report.ok {
        Ok(())
    } else {
        Err(LaunchError::Host(format!(
            "the host cannot boot the appliance yet: {} failed (the fixes are listed above)",
            report.failed().join(", ")
        )))
    }
}

fn print(report: &Report, json: bool) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if json {
        let line = serde_json::to_string(report).map_err(std::io::Error::other)?;
        writeln!(out, "{line}")
    } else {
        report.render(&mut out)
    }
}
