//! The real backends of chat and batch: an [`Appliance`] — the Kore VM booted
//! for the command, the background appliance of `kore-launch up` (attached),
//! or with `--native` the engine in-process — behind the [`Backend`] seam.

use std::path::Path;

use super::{Backend, Placement, Streams};
use crate::appliance::Appliance;
use crate::error::Result;

/// Opens the appliance for `placement` ([`Appliance::open_for`]; `attach`:
/// use a background appliance of `kore-launch up` when one answers).
pub fn open(placement: &Placement, attach: bool) -> Result<Box<dyn Backend>> {
    let (appliance, model) =
        Appliance::open_for(placement.model.as_deref(), placement.native, attach)?;
    Ok(Box::new(ApplianceBackend { appliance, model: display_name(&model) }))
}

fn display_name(model: &Path) -> String {
    model.file_name().map_or_else(|| model.display().to_string(), |n| n.to_string_lossy().into())
}

struct ApplianceBackend {
    appliance: Appliance,
    model: String,
}

impl Backend for ApplianceBackend {
    fn streams(&self) -> Result<Streams> {
        let c = self.appliance.connect()?;
        Ok((c.reader, c.writer))
    }

    fn describe(&self) -> String {
        match self.appliance.placement() {
            "native" => format!("{} in-process (--native)", self.model),
            "vm" => format!("{} in the Kore VM", self.model),
            _ => "the background appliance (kore-launch up)".into(),
        }
    }

    fn vmm(&self) -> Option<serde_json::Value> {
        self.appliance.confinement().and_then(|c| serde_json::to_value(c).ok())
    }

    fn shutdown(self: Box<Self>) -> Result<()> {
        self.appliance.shutdown();
        Ok(())
    }
}
