//! Command-line definitions (clap). Names and flags follow the shared
//! contract exactly; new flags may be added, none renamed or dropped.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Boot and drive the Kore LLM appliance.
#[derive(Debug, Parser)]
#[command(name = "kore-launch", version, about)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Config file to use instead of ~/.config/kore/launch.toml (also KORE_CONFIG).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The CPU the VMM presents to the guest: host (default), x86-64-v3 (no AVX-512) or
    /// x86-64-v2 (no AVX); also config key `guest_cpu` and KORE_GUEST_CPU.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub guest_cpu: Option<kore_vmm::GuestCpu>,
    /// PCI function (DDDD:BB:DD.F, bound to vfio-pci) to pass through to the appliance VM
    /// with VFIO; also config key `vf` and KORE_VF. For `setup`: the VF to bind to vfio-pci.
    #[arg(long, global = true, value_name = "PCI_ADDR")]
    pub vf: Option<String>,
    /// The prefix cache's memory budget, e.g. 512M (0: off); also config key `cache` and
    /// KORE_CACHE.
    #[arg(long, global = true, value_name = "SIZE", value_parser = crate::config::parse_budget)]
    pub cache: Option<u64>,
    /// The prefix cache's disk budget under $XDG_CACHE_HOME/kore, e.g. 8G (0: none); also
    /// config key `cache_disk` and KORE_CACHE_DISK.
    #[arg(long, global = true, value_name = "SIZE", value_parser = crate::config::parse_budget)]
    pub cache_disk: Option<u64>,
    /// The command; with none, boot the default pack and open the chat.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// All `kore-launch` commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Raw completion of a prompt (no chat template).
    Generate(GenerateArgs),
    /// Chat with the model: interactive, or one-shot with -p.
    Chat(ChatArgs),
    /// Tokenize text with the model's tokenizer.
    Tokenize(TokenizeArgs),
    /// Run a JSONL file of requests.
    Batch(BatchArgs),
    /// Measure prefill/decode speed against the machine's memory bandwidth.
    Bench(BenchArgs),
    /// Build, verify and inspect model packs.
    #[command(subcommand)]
    Pack(PackCommand),
    /// Start a background appliance.
    Up(UpArgs),
    /// Stop the background appliance.
    Down(RuntimeArgs),
    /// Describe the background appliance.
    Status(StatusArgs),
    /// The background appliance's process (started by `up`).
    #[command(hide = true)]
    Daemon(DaemonArgs),
    /// Serve the OpenAI HTTP API and a web chat (loopback; other hosts need --api-key).
    Serve(ServeArgs),
    /// Prepare the host (hugepages, SR-IOV VF for VFIO).
    Setup(SetupArgs),
    /// Check the host and say how to fix each problem.
    Doctor(JsonFlag),
    /// Show (per pack, size, age) or clear the prefix cache's checkpoint files.
    Cache(CacheArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `--json`: print one JSON object as the last line of stdout.
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct JsonFlag {
    /// Print a JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

/// Sampling and drafting options shared by generate, chat and batch.
#[derive(Debug, Args, Clone, Default)]
pub struct SamplingArgs {
    /// Constrain the output to this JSON Schema (a file): the answer is
    /// JSON valid under it (`response_format: json_schema`).
    #[arg(long, value_name = "FILE", value_parser = read_schema)]
    pub json_schema: Option<kore_protocol::RawJson>,
    /// Maximum number of tokens to generate.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only the K most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens below this fraction of the top token's probability.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// RNG seed for sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Draft tokens per step with the MTP head (0 turns drafting off).
    #[arg(long)]
    pub mtp: Option<usize>,
}

/// Arguments of `generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Run the engine in-process on the host instead of in the guest.
    #[arg(long)]
    pub native: bool,
    /// Pack directory or Hugging Face model directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub json: JsonFlag,
}

/// Arguments of `chat` (the default: what `kore-launch` with no arguments runs).
#[derive(Debug, Args, Default)]
pub struct ChatArgs {
    /// Run the engine in-process on the host instead of in the guest.
    #[arg(long)]
    pub native: bool,
    /// Pack directory or Hugging Face model directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Answer this prompt once and exit.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// System prompt of the conversation (default: config key `system_prompt`).
    #[arg(long)]
    pub system: Option<String>,
    /// Thinking mode.
    #[arg(long, value_enum)]
    pub thinking: Option<OnOff>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub json: JsonFlag,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Arguments of `tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// Pack directory or Hugging Face model directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Text to tokenize.
    #[arg(long, conflicts_with_all = ["file", "chat"], required_unless_present_any = ["file", "chat"])]
    pub text: Option<String>,
    /// File whose contents to tokenize.
    #[arg(long, conflicts_with = "chat")]
    pub file: Option<PathBuf>,
    /// An OpenAI chat request body (`messages`, optional `tools` and
    /// `chat_template_kwargs`): print the prompt the chat template renders.
    #[arg(long)]
    pub chat: Option<PathBuf>,
    #[command(flatten)]
    pub json: JsonFlag,
}

/// Arguments of `batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Input JSONL file (`-` for stdin).
    pub input: PathBuf,
    /// Output JSONL file (`-` for stdout).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Run the engine in-process on the host instead of in the guest.
    #[arg(long)]
    pub native: bool,
    /// Pack directory or Hugging Face model directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Thinking mode for chat lines that do not set `thinking`.
    #[arg(long, value_enum)]
    pub thinking: Option<OnOff>,
    /// Exit non-zero when any line ends as an error row.
    #[arg(long)]
    pub fail_on_error: bool,
    /// Defaults for lines that do not set these parameters.
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Run the engine in-process on the host instead of in the guest.
    #[arg(long)]
    pub native: bool,
    /// Pack directory or Hugging Face model directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Draft tokens per step with the MTP head (0 turns drafting off).
    #[arg(long)]
    pub mtp: Option<usize>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sequences decoding together (one batched forward a step).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Prompt tokens of the prefill measurement (default 512; llama-bench's -p).
    #[arg(short = 'p', long = "prompt-tokens")]
    pub prompt_tokens: Option<u32>,
    /// Tokens decoded for the decode measurement (default 128; llama-bench's -n).
    #[arg(short = 'n', long = "decode-tokens")]
    pub decode_tokens: Option<u32>,
    /// Positions of context before the prompt: prefill and decode measured at
    /// this depth (default 0; llama-bench's -d).
    #[arg(short = 'd', long = "depth")]
    pub depth: Option<u32>,
    #[command(flatten)]
    pub json: JsonFlag,
}

/// `pack` subcommands.
#[derive(Debug, Subcommand)]
pub enum PackCommand {
    /// Import a Hugging Face checkpoint (bf16/f32 or ModelOpt NVFP4) as a pack.
    Import(PackImportArgs),
    /// Check a pack's checksums, shapes and config; non-zero on any defect.
    Verify {
        /// The pack directory.
        pack: PathBuf,
    },
    /// Show a pack's tensors, sizes and quantization.
    Inspect {
        /// The pack directory.
        pack: PathBuf,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Write a pack with a preset's exact shapes and random NVFP4 weights.
    Synth {
        /// qwen3.5-0.8b, qwen3.5-2b, qwen3.5-4b, qwen3.5-9b, qwen3.5-27b,
        /// qwen3.5-35b-a3b (MoE) or qwen3.5-moe-tiny (a small MoE for tests).
        #[arg(long)]
        preset: String,
        /// Output pack directory.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
        /// Seed of the random weights: the same preset and seed give byte-identical packs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Storage of the output head (a tied model gets a separate copy for
        /// q8/nvfp4, an untied nvfp4 head a q8 copy that rescores its best
        /// candidates); default nvfp4 (docs/pack-format.md).
        #[arg(long, value_enum)]
        head: Option<Head>,
        /// Keep only the first N decoder layers (same shapes), for hosts that
        /// cannot hold the whole model.
        #[arg(long, value_name = "N")]
        layers: Option<u64>,
    },
}

/// Output head storage (`--head`); see docs/pack-format.md for the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Head {
    /// bfloat16 (a tied model's embedding is its head).
    Bf16,
    /// int8 with one f16 scale per 32 columns.
    Q8,
    /// NVFP4 as the other linears, its best candidates rescored exactly.
    Nvfp4,
}

impl From<Head> for kore_pack::head::HeadFormat {
    fn from(h: Head) -> Self {
        match h {
            Head::Bf16 => Self::Bf16,
            Head::Q8 => Self::Q8,
            Head::Nvfp4 => Self::Nvfp4,
        }
    }
}

/// Arguments of `pack import`.
#[derive(Debug, Args)]
pub struct PackImportArgs {
    /// Hugging Face model directory.
    pub hf_dir: PathBuf,
    /// Output pack directory.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Weight format for the quantizable linears.
    #[arg(long, value_enum, default_value_t = Quant::Nvfp4)]
    pub quant: Quant,
    /// Linear families quantized with NVFP4 (comma-separated: mlp, attention,
    /// linear-attention, experts, router, lm-head, mtp-fc; experts and router
    /// exist in MoE models only).
    #[arg(long, value_delimiter = ',', default_value = "mlp,attention,linear-attention,experts")]
    pub quantize: Vec<String>,
    /// Keep modules matching this glob unquantized (repeatable), e.g. 'model.layers.0.*'.
    #[arg(long, value_name = "GLOB")]
    pub keep: Vec<String>,
    /// Model name recorded in pack.toml (default: the directory name).
    #[arg(long)]
    pub name: Option<String>,
    /// Context length recorded in pack.toml (default: the config's max_position_embeddings).
    #[arg(long)]
    pub context_length: Option<u64>,
    /// Storage of the output head (default: bf16 with `--quant bf16`, else
    /// nvfp4 with its best candidates rescored exactly; docs/pack-format.md).
    #[arg(long, value_enum)]
    pub head: Option<Head>,
}

/// Quantization choice for `pack import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Quant {
    /// NVIDIA ModelOpt NVFP4 (E2M1 + E4M3 block scales of 16 + global scale).
    Nvfp4,
    /// Keep bf16.
    Bf16,
    /// No quantization, no conversion: matrices keep the checkpoint's dtype (f32, bf16, f16).
    None,
}

/// Arguments of `up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Run the engine in-process in the background process instead of in the guest.
    #[arg(long)]
    pub native: bool,
    /// Pack directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Directory of the pidfile and socket (default: KORE_RUNTIME_DIR, config runtime_dir, $XDG_RUNTIME_DIR/kore or /tmp/kore-$UID).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
}

/// Arguments of `serve`.
#[derive(Debug, Args)]
#[command(after_help = "Security: the server listens on 127.0.0.1 by default. Any other --host \
(e.g. 0.0.0.0) requires --api-key; clients then send `Authorization: Bearer KEY`. \
Point an OpenAI client at http://HOST:PORT/v1; the web chat is at http://HOST:PORT/.")]
pub struct ServeArgs {
    /// Run the engine in-process on the host instead of in the guest.
    #[arg(long)]
    pub native: bool,
    /// Pack directory or Hugging Face model directory (default: model-packs/tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Address to listen on; anything but loopback requires --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Key the API requires as `Authorization: Bearer KEY` (required off loopback).
    #[arg(long, env = "KORE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// Arguments of `down`.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// Directory of the pidfile and socket (default: KORE_RUNTIME_DIR, config runtime_dir, $XDG_RUNTIME_DIR/kore or /tmp/kore-$UID).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
}

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Directory of the pidfile and socket (default: KORE_RUNTIME_DIR, config runtime_dir, $XDG_RUNTIME_DIR/kore or /tmp/kore-$UID).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// Print a JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of the hidden `daemon` command.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Directory of the pidfile and socket.
    #[arg(long)]
    pub runtime_dir: PathBuf,
    /// Run the engine in-process.
    #[arg(long)]
    pub native: bool,
    /// Pack directory.
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// Arguments of `setup`.
#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Print the changes without making them.
    #[arg(long)]
    pub dry_run: bool,
    /// Pack or Hugging Face model directory to size hugepages for (default: model-packs/tiny).
    #[arg(long, alias = "pack")]
    pub model: Option<PathBuf>,
    /// Context length (tokens) to size the KV cache for (default 65536).
    #[arg(long)]
    pub context: Option<u64>,
    /// Hugepage size backing guest memory: 2M, 1G or off.
    #[arg(long, value_parser = clap::builder::ValueParser::new(parse_hugepage_size))]
    pub hugepage_size: Option<crate::host::HugepageSize>,
    /// Reserve this much guest memory instead of what the pack needs (e.g. 8G).
    #[arg(long, value_parser = clap::builder::ValueParser::new(crate::config::parse_size))]
    pub memory: Option<u64>,
    /// GPU physical function (PCI address, e.g. 0000:03:00.0) on which to enable SR-IOV VFs.
    #[arg(long, value_name = "PCI_ADDR")]
    pub gpu: Option<String>,
    /// Number of VFs to enable on --gpu.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub vfs: u64,
}

/// Arguments of `cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// `clear`: delete the checkpoint files (of `--pack` only, when given).
    #[command(subcommand)]
    pub action: Option<CacheAction>,
    /// Print a JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

/// `cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// Delete the checkpoint files.
    Clear {
        /// Only this pack's: a pack directory or the identity `kore-launch cache` lists.
        #[arg(long)]
        pack: Option<String>,
    },
}

fn parse_hugepage_size(s: &str) -> std::result::Result<crate::host::HugepageSize, String> {
    s.parse()
}

/// Reads a `--json-schema` file: its JSON text, order kept.
fn read_schema(path: &str) -> std::result::Result<kore_protocol::RawJson, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    serde_json::from_str::<kore_protocol::RawJson>(&text)
        .map_err(|e| format!("{path}: not JSON ({e})"))
}
