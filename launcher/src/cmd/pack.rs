//! `kore-launch pack import|verify|inspect|synth`: model packs (crate kore-pack).

use crate::cli::{PackCommand, PackImportArgs, Quant};
use crate::error::{LaunchError, Result};
use crate::term::progress::Bar;
use kore_pack::config::LinearGroup;
use kore_pack::head::HeadFormat;
use kore_pack::import::{ImportOptions, QuantMode};
use kore_pack::PackError;
use std::path::Path;

/// Runs one `pack` subcommand.
pub fn run(cmd: PackCommand) -> Result<()> {
    match cmd {
        PackCommand::Import(args) => import(&args),
        PackCommand::Verify { pack } => verify(&pack),
        PackCommand::Inspect { pack, json } => inspect(&pack, json.json),
        PackCommand::Synth { preset, output, seed, head, layers } => {
            let head = head.map_or(kore_pack::head::DEFAULT_HEAD, Into::into);
            synth(&preset, &output, seed, head, layers)
        }
    }
}

fn model_err(e: PackError) -> LaunchError {
    LaunchError::Model(e.to_string())
}

fn import(args: &PackImportArgs) -> Result<()> {
    let mut groups = std::collections::BTreeSet::new();
    for g in args.quantize.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let group = LinearGroup::parse(g).ok_or_else(|| {
            LaunchError::Usage(format!("--quantize: unknown family `{g}` (mlp, attention, linear-attention, experts, router, lm-head, mtp-fc)"))
        })?;
        groups.insert(group);
    }
    let opts = ImportOptions {
        quant: match args.quant {
            Quant::Nvfp4 => QuantMode::Nvfp4,
            Quant::Bf16 => QuantMode::Bf16,
            Quant::None => QuantMode::Keep,
        },
        groups,
        keep: args.keep.clone(),
        name: args.name.clone(),
        context_length: args.context_length,
        head: args.head.map(Into::into),
    };
    let bar = Bar::default();
    let s =
        kore_pack::import::import(&args.hf_dir, &args.output, &opts, &bar).map_err(model_err)?;
    println!(
        "{}: {} tensors, {} NVFP4 modules ({} copied from ModelOpt), {} bytes of weights, MTP head: {}",
        args.output.display(),
        s.tensors,
        s.nvfp4_modules,
        s.copied_nvfp4,
        s.weights_bytes,
        if s.mtp { "yes" } else { "no" }
    );
    Ok(())
}

fn verify(pack: &Path) -> Result<()> {
    let bar = Bar::default();
    let r = kore_pack::pack::verify(pack, &bar).map_err(model_err)?;
    println!(
        "{}: OK ({} files, {} bytes hashed, {} tensors, {} NVFP4 modules)",
        pack.display(),
        r.files,
        r.bytes,
        r.tensors,
        r.nvfp4_modules
    );
    Ok(())
}

fn inspect(dir: &Path, json: bool) -> Result<()> {
    let pack = kore_pack::Pack::open(dir).map_err(model_err)?;
    let report = kore_pack::inspect::inspect(&pack);
    if json {
        let line = serde_json::to_string(&report)?;
        println!("{line}");
        return Ok(());
    }
    println!(
        "{} ({}, format {}): {} layers, hidden {}, vocab {}, context {}, MTP {}",
        report.name,
        report.architecture,
        report.format_version,
        report.layers,
        report.hidden_size,
        report.vocab_size,
        report.context_length,
        if report.mtp { "yes" } else { "no" }
    );
    println!("{:<64} {:<8} {:<20} {:>14} quant", "tensor", "dtype", "shape", "bytes");
    for t in &report.tensors {
        println!(
            "{:<64} {:<8} {:<20} {:>14} {}",
            t.name,
            t.dtype,
            format!("{:?}", t.shape),
            t.bytes,
            t.quant
        );
    }
    println!(
        "total: {} parameters, {} NVFP4 modules, {} bytes in weights.safetensors ({} padding)",
        report.parameters, report.nvfp4_modules, report.file_bytes, report.padding_bytes
    );
    for (q, b) in &report.bytes_by_quant {
        println!("  {q:<6} {b:>14} bytes");
    }
    for (d, b) in &report.bytes_by_dtype {
        println!("  {d:<6} {b:>14} bytes");
    }
    Ok(())
}

fn synth(preset: &str, out: &Path, seed: u64, head: HeadFormat, layers: Option<u64>) -> Result<()> {
    let config = kore_pack::synth::preset(preset).map_err(|e| LaunchError::Usage(e.to_string()))?;
    if let Some(n) = layers {
        kore_pack::synth::cut_depth(config, n).map_err(|e| LaunchError::Usage(e.to_string()))?;
    }
    let bar = Bar::default();
    let pack = kore_pack::synth::synth(preset, out, seed, head, layers, &bar).map_err(model_err)?;
    let bytes = pack.manifest().files.get("weights.safetensors").map(|f| f.bytes).unwrap_or(0);
    println!("{}: synthetic {preset} pack ({head} head), {bytes} bytes of weights", out.display());
    Ok(())
}
