//! `kore-launch generate` in the Kore VM: boots the appliance (guest kernel +
//! ring-3 appliance image from `target/guest`, the tiny pack preloaded),
//! sends the request over vsock port 1025, and checks the greedy ids and text
//! equal `generate --native` on the same pack.
//!
//! Needs /dev/kvm, 2 MiB hugepages and the guest images (see
//! [`kore_e2e::guest_images`]); without them the tests fail with what to run.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn kore(args: &[&str], runtime: &Path) -> Output {
    Command::new(kore_e2e::kore_launch())
        .args(args)
        .env_remove("KORE_APPLIANCE")
        .env("KORE_RUNTIME_DIR", runtime)
        .output()
        .expect("run kore-launch")
}

fn last_json(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kore-launch failed: {stderr}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

#[test]
fn generate_in_the_vm_equals_native() {
    kore_e2e::guest_images();
    let pack = kore_e2e::tiny_pack().to_str().unwrap().to_string();
    let runtime = std::env::temp_dir().join(format!("kore-vm-test-{}", std::process::id()));
    for extra in [
        &["--prompt", "ROMEO:\nBut soft, what light"][..],
        &["--prompt-ids", "4071,882,198,11,4072"][..],
    ] {
        let mut args =
            vec!["generate", "--model", &pack, "--max-tokens", "24", "--mtp", "0", "--json"];
        args.extend_from_slice(extra);
        let vm = last_json(&kore(&args, &runtime));
        args.push("--native");
        let native = last_json(&kore(&args, &runtime));
        assert!(!native["token_ids"].as_array().unwrap().is_empty());
        assert_eq!(vm["token_ids"], native["token_ids"], "vm {vm}\nnative {native}");
        assert_eq!(vm["text"], native["text"]);
        assert_eq!(vm["stop_reason"], native["stop_reason"]);
    }
    // The per-boot runtime directory is cleaned up.
    let left: Vec<_> = std::fs::read_dir(&runtime)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind in {}: {left:?}", runtime.display());
    let _ = std::fs::remove_dir_all(&runtime);
}

fn kore_env(args: &[&str], runtime: &Path) -> Command {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") && !key.starts_with("KORE_GUEST_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(args).env("XDG_CONFIG_HOME", "/nonexistent").env("KORE_RUNTIME_DIR", runtime);
    cmd
}

#[test]
fn batch_through_the_vm_answers_every_line_in_order() {
    let kore_e2e::VmScratch { pack, dir, runtime } = kore_e2e::VmScratch::new();
    let (input, out_vm, out_native) =
        (dir.path().join("in.jsonl"), dir.path().join("vm.jsonl"), dir.path().join("native.jsonl"));
    let speakers = ["ROMEO", "JULIET", "HAMLET", "KING", "QUEEN", "MERCUTIO", "LEAR"];
    let mut text = String::new();
    for i in 0..20 {
        if i == 7 {
            text.push_str("{\"id\": 7, \"prompt\": \n"); // not JSON
            continue;
        }
        let line = if i % 5 == 4 {
            serde_json::json!({"id": i, "messages": [{"role": "user", "content": speakers[i % 7]}],
                               "thinking": "off", "max_tokens": 6})
        } else {
            serde_json::json!({"id": i, "prompt": format!("{}:\n", speakers[i % 7]), "max_tokens": 6})
        };
        text.push_str(&format!("{line}\n"));
    }
    std::fs::write(&input, text).unwrap();
    let run = |out: &Path, native: bool| {
        let mut args = vec!["batch", input.to_str().unwrap(), "-o", out.to_str().unwrap()];
        args.extend(["--model", &pack, "--concurrency", "4"]);
        if native {
            args.push("--native");
        }
        let o = kore_env(&args, &runtime).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        kore_e2e::read_jsonl(out)
    };
    let vm = run(&out_vm, false);
    let native = run(&out_native, true);
    assert_eq!(vm.len(), 20);
    for (i, row) in vm.iter().enumerate() {
        if i == 7 {
            assert_eq!(row["line"], 8, "{row}");
            assert_eq!(row["error"]["code"], "bad_json", "{row}");
            continue;
        }
        assert_eq!(row["id"], i, "{row}");
        let n = row["token_ids"].as_array().unwrap_or_else(|| panic!("no ids: {row}")).len();
        assert!((1..=6).contains(&n), "{row}");
        assert_eq!(
            row["token_ids"], native[i]["token_ids"],
            "line {i}: vm {row}\nnative {}",
            native[i]
        );
        assert_eq!(row["text"], native[i]["text"], "line {i}");
    }
}

#[test]
fn up_generate_attaches_status_down() {
    let kore_e2e::VmScratch { pack, dir: _dir, runtime } = kore_e2e::VmScratch::new();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = kore_env(args, &runtime);
        c.envs(env.iter().copied());
        c.output().unwrap()
    };
    let o = run(&["up", "--model", &pack], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    struct Down<'a>(&'a dyn Fn());
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            (self.0)()
        }
    }
    let down = || drop(run(&["down"], &[]));
    let _down = Down(&down);
    let st = last_json(&run(&["status", "--json"], &[]));
    assert_eq!(st["running"], true, "{st}");
    assert!(st["engine"].as_str().unwrap().contains("Kore VM"), "{st}");
    // With image paths that do not exist, only attaching can answer.
    let no_images =
        [("KORE_GUEST_KERNEL", "/nonexistent/kernel"), ("KORE_GUEST_IMAGE", "/nonexistent/image")];
    let args = ["generate", "--prompt", "ROMEO:", "--max-tokens", "8", "--json"];
    let attached = last_json(&run(&args, &no_images));
    let mut native_args = args.to_vec();
    native_args.extend(["--native", "--model", &pack]);
    let native = last_json(&run(&native_args, &[]));
    assert_eq!(attached["token_ids"], native["token_ids"]);
    let o = run(&["down"], &[]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("appliance stopped"), "{o:?}");
    let st = last_json(&run(&["status", "--json"], &[]));
    assert_eq!(st["running"], false, "{st}");
    assert!(!runtime.join("kore.sock").exists());
}

#[test]
fn a_hugging_face_directory_is_imported_for_the_vm() {
    let kore_e2e::VmScratch { dir: _dir, runtime, .. } = kore_e2e::VmScratch::new();
    let hf = kore_e2e::tiny_hf();
    let hf = hf.to_str().unwrap();
    let args = ["generate", "--model", hf, "--prompt", "JULIET:", "--max-tokens", "12", "--json"];
    let vm = last_json(&kore_env(&args, &runtime).output().unwrap());
    let packs: Vec<_> = std::fs::read_dir(runtime.join("packs")).unwrap().flatten().collect();
    assert_eq!(packs.len(), 1, "one imported pack");
    assert!(packs[0].path().join("pack.toml").is_file());
    let mut native_args = args.to_vec();
    native_args.push("--native");
    let native = last_json(&kore_env(&native_args, &runtime).output().unwrap());
    // bf16 import of a bf16 model: the same weights, the same greedy ids.
    assert_eq!(vm["token_ids"], native["token_ids"], "vm {vm}\nnative {native}");
    // A second run reuses the import.
    let again = last_json(&kore_env(&args, &runtime).output().unwrap());
    assert_eq!(again["token_ids"], vm["token_ids"]);
    assert_eq!(std::fs::read_dir(runtime.join("packs")).unwrap().count(), 1);
}

/// One guest image for every CPU level: at `--guest-cpu x86-64-v3` (no AVX-512: an EVEX
/// instruction would fault) and `x86-64-v2` (no AVX) the appliance boots, picks the kernel
/// path that level allows (the bench reports it), and its greedy tokens equal `--native` forced
/// onto the same path with `KORE_KERNELS`.
#[test]
fn every_guest_cpu_level_boots_and_equals_native_on_its_kernel_path() {
    let kore_e2e::VmScratch { pack, dir: _dir, runtime } = kore_e2e::VmScratch::new();
    for (level, path) in [("x86-64-v3", "avx2"), ("x86-64-v2", "generic")] {
        let bench = ["bench", "--model", &pack, "--guest-cpu", level, "--json"];
        let bench = last_json(&kore_env(&bench, &runtime).output().unwrap());
        assert_eq!(bench["kernels"], path, "{level}: {bench}");
        let args = [
            "generate",
            "--model",
            &pack,
            "--prompt",
            "ROMEO:",
            "--max-tokens",
            "24",
            "--mtp",
            "0",
            "--json",
            "--guest-cpu",
            level,
        ];
        let vm = last_json(&kore_env(&args, &runtime).output().unwrap());
        let mut native = kore_env(&args[..10], &runtime);
        native.arg("--native").env("KORE_KERNELS", path);
        let native = last_json(&native.output().unwrap());
        assert!(!vm["token_ids"].as_array().unwrap().is_empty());
        assert_eq!(vm["token_ids"], native["token_ids"], "{level}: vm {vm}\nnative {native}");
        assert_eq!(vm["text"], native["text"]);
    }
}
