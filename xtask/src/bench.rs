//! `cargo xtask bench`: stock vs overlay in the same binary on the same GGUF, A/B/A
//! (GGML_CUDA_FLASHRT_DISABLE=1, default, disabled again), with the device's bandwidth measured
//! once, so that each number comes with its ratio to stock and its share of the bandwidth floor.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::build::{self, BuildArgs};
use crate::doctor;
use crate::gguf::{self, Value};
use crate::project::{note, step, write_atomic, Project};
use crate::synth::{self, Preset};
use crate::test_backend_ops;
use crate::toolchain::{self, CudaChoice, Provision};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub target: GpuModelArgs,
    /// Tests, comma-separated: tgN (generate N tokens), ppN (prompt of N), either @dDEPTH.
    #[arg(long, value_delimiter = ',', default_value = "tg128,pp512,tg128@d8192")]
    pub tests: Vec<String>,
    /// Also run the overlay with each window disabled alone (its contribution).
    #[arg(long)]
    pub sweep: bool,
    /// Also run the overlay with these switches, in every round beside the default (an A/B of an
    /// experiment against the default, interleaved like stock and overlay): ENV=VALUE, several
    /// comma-separated; repeat the option for more settings.
    #[arg(long, value_name = "ENV=VALUE[,ENV=VALUE...]")]
    pub also: Vec<String>,
    /// Repetitions per llama-bench run.
    #[arg(long, default_value_t = 5)]
    pub reps: u32,
    /// Rounds of stock/overlay (and the sweep's and --also's settings), closed by a last stock run: A B A B … A.
    /// More rounds resolve smaller effects: drift between runs is a few percent on these machines,
    /// and each round's ratio is taken against the stock runs on either side of it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// How llama-bench spreads the model over the visible GPUs (its -sm; left to llama-bench, which
    /// splits by layer, when not given). `row` fails to load at this pin ("does not support split
    /// buffers"): CUDA has no split buffer type there.
    #[arg(long, value_enum, value_name = "MODE")]
    pub split_mode: Option<SplitMode>,
    /// Share of the model per GPU, comma-separated, e.g. 1,1 or 3,1 (llama-bench's -ts, which
    /// writes it 1/1; not passed when not given).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub tensor_split: Vec<f64>,
}

/// llama-bench's split modes at the pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// Whole layers per GPU (llama-bench's default).
    Layer,
    /// Rows of each weight matrix per GPU (needs a split buffer type, which CUDA lacks at this pin).
    Row,
    /// Upstream's tensor parallelism.
    Tensor,
    /// GPU 0 only.
    None,
}

impl SplitMode {
    fn name(self) -> &'static str {
        match self {
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::Tensor => "tensor",
            SplitMode::None => "none",
        }
    }
}

/// How the model is spread over GPUs, as given on the command line (empty: llama-bench decides).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Split {
    mode: Option<SplitMode>,
    /// Empty when not given.
    tensor_split: Vec<f64>,
}

impl Split {
    fn from_args(args: &BenchArgs) -> Result<Split> {
        if let Some(bad) = args
            .tensor_split
            .iter()
            .find(|share| !share.is_finite() || **share < 0.0)
        {
            bail!("--tensor-split: {bad} is not a share (use non-negative numbers, e.g. 1,1)");
        }
        Ok(Split {
            mode: args.split_mode,
            tensor_split: args.tensor_split.clone(),
        })
    }

    /// llama-bench's -ts syntax: one setting, shares separated by '/' (a ',' would start a
    /// second setting).
    fn tensor_split_text(&self) -> String {
        self.tensor_split
            .iter()
            .map(f64::to_string)
            .collect::<Vec<_>>()
            .join("/")
    }

    fn llama_bench_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(mode) = self.mode {
            args.extend(["-sm".to_owned(), mode.name().to_owned()]);
        }
        if !self.tensor_split.is_empty() {
            args.extend(["-ts".to_owned(), self.tensor_split_text()]);
        }
        args
    }

    /// Words for file names and headers, e.g. ["split-tensor", "ts1-1"]; none when not given.
    fn tags(&self) -> Vec<String> {
        let mut tags = Vec::new();
        if let Some(mode) = self.mode {
            tags.push(format!("split-{}", mode.name()));
        }
        if !self.tensor_split.is_empty() {
            tags.push(format!("ts{}", self.tensor_split_text().replace('/', "-")));
        }
        tags
    }
}

/// A model on the overlay build, as `bench` and `parity` take it.
#[derive(Debug, Args)]
pub struct GpuModelArgs {
    /// The GGUF to run.
    #[arg(long, value_name = "FILE", conflicts_with = "preset")]
    pub model: Option<PathBuf>,
    /// Or a synth preset (written once into .xtask/models).
    #[arg(long, value_enum, default_value = "qwen36-35b-a3b")]
    pub preset: Preset,
    /// Seed of the synth preset.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CUDA architecture to build for (default: the host's default).
    #[arg(long, value_name = "ARCH")]
    pub arch: Option<String>,
    /// Use this local checkout, extracted tree or archive (.tar.xz, .tar.gz, .tar; e.g. from
    /// `host pack`) as the host source; it must match the pin.
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub host_src: Option<PathBuf>,
}

/// What [`GpuModelArgs::prepare`] made ready.
pub struct Prepared {
    pub build_dir: PathBuf,
    pub model: PathBuf,
    /// The first visible GPU's name, as nvidia-smi gives it.
    pub gpu: String,
}

impl Prepared {
    /// A binary or library in the build's bin/.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.build_dir.join("bin").join(name)
    }
}

impl GpuModelArgs {
    /// Checks for a GPU, builds the CMake `target` with the overlay, and finds or writes the model.
    pub fn prepare(
        &self,
        sh: &Shell,
        project: &Project,
        command: &str,
        target: &str,
    ) -> Result<Prepared> {
        let gpu = match doctor::gpus(sh) {
            Ok(gpus) => gpus[0].0.clone(),
            Err(why) => bail!("no NVIDIA GPU visible ({why}): cargo xtask {command} runs the CUDA build; run it on a GPU machine"),
        };
        let built = build::build(
            sh,
            project,
            &BuildArgs {
                arch: self.arch.iter().cloned().collect(),
                targets: vec![target.to_owned()],
                host_src: self.host_src.clone(),
                ..BuildArgs::new("llama.cpp")
            },
        )?;
        let model = match &self.model {
            Some(model) => model.clone(),
            None => synth::ensure_model(sh, project, self.preset, self.seed)?,
        };
        Ok(Prepared {
            build_dir: built.build_dir,
            model,
            gpu,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TestSpec {
    /// true: token generation (tgN); false: prompt processing (ppN).
    generate: bool,
    n: u32,
    depth: u32,
}

impl TestSpec {
    pub fn parse(text: &str) -> Result<TestSpec> {
        let (main, depth) = match text.split_once("@d") {
            Some((main, depth)) => (
                main,
                depth.parse().with_context(|| format!("{text}: depth"))?,
            ),
            None => (text, 0),
        };
        let (generate, n) = if let Some(n) = main.strip_prefix("tg") {
            (true, n)
        } else if let Some(n) = main.strip_prefix("pp") {
            (false, n)
        } else {
            bail!("test {text:?}: use tgN, ppN, optionally @dDEPTH (e.g. tg128@d8192)");
        };
        let n = n.parse().with_context(|| format!("test {text:?}: count"))?;
        Ok(TestSpec { generate, n, depth })
    }

    pub fn name(&self) -> String {
        let kind = if self.generate { "tg" } else { "pp" };
        let depth = if self.depth > 0 {
            format!("@d{}", self.depth)
        } else {
            String::new()
        };
        format!("{kind}{}{depth}", self.n)
    }

    fn llama_bench_args(&self) -> Vec<String> {
        let (p, n) = if self.generate {
            (0, self.n)
        } else {
            (self.n, 0)
        };
        [
            "-p",
            &p.to_string(),
            "-n",
            &n.to_string(),
            "-d",
            &self.depth.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    if v.is_empty() {
        f64::NAN
    } else if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// GGUF tensor bytes per element block, for the types llama.cpp models use.
pub fn type_block(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),      // F32
        1 | 30 => (1, 2), // F16, BF16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        _ => return None,
    })
}

/// Bytes read per decoded token from a GGUF's header: every weight but the token embedding
/// (one row) and the multi-token-prediction layers, experts (`_exps`) at
/// expert_used_count / expert_count.
pub fn bytes_per_token(path: &Path) -> Result<f64> {
    let header = gguf::read_header(path)?;
    let arch = match header.kv.iter().find(|(k, _)| k == "general.architecture") {
        Some((_, Value::String(a))) => a.clone(),
        _ => bail!("{}: no general.architecture", path.display()),
    };
    let get_u32 = |key: String| {
        header
            .kv
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| match v {
                Value::U32(x) => Some(*x as f64),
                _ => None,
            })
    };
    let share = match (
        get_u32(format!("{arch}.expert_used_count")),
        get_u32(format!("{arch}.expert_count")),
    ) {
        (Some(used), Some(all)) if all > 0.0 => used / all,
        _ => 1.0,
    };
    // Multi-token-prediction layers come last and are not read by ordinary decoding.
    let first_mtp_block = match (
        get_u32(format!("{arch}.block_count")),
        get_u32(format!("{arch}.nextn_predict_layers")),
    ) {
        (Some(blocks), Some(nextn)) => (blocks - nextn) as u64,
        _ => u64::MAX,
    };
    let block_of =
        |name: &str| -> Option<u64> { name.strip_prefix("blk.")?.split('.').next()?.parse().ok() };
    let mut total = 0.0;
    for t in &header.tensors {
        if t.name == "token_embd.weight" || block_of(&t.name).is_some_and(|b| b >= first_mtp_block)
        {
            continue;
        }
        let (per, bytes) = type_block(t.ggml_type).with_context(|| {
            format!(
                "{}: tensor {} has ggml type {}",
                path.display(),
                t.name,
                t.ggml_type
            )
        })?;
        let size = (t.dims.iter().product::<u64>() / per * bytes) as f64;
        total += if t.name.contains("_exps") {
            size * share
        } else {
            size
        };
    }
    Ok(total)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bandwidth {
    pub gpu: String,
    pub read_tbps: f64,
    pub copy_tbps: f64,
}

#[derive(Debug, Serialize)]
struct Run {
    setting: String,
    env: Vec<(String, String)>,
    /// 1-based; the closing stock run has round `rounds + 1`.
    round: u32,
    samples_ts: Vec<f64>,
    median_ts: f64,
}

#[derive(Debug, Serialize)]
struct TestResult {
    test: String,
    runs: Vec<Run>,
    /// Medians over every sample of every round.
    stock_ts: f64,
    overlay_ts: f64,
    ratio: f64,
    /// The spread of the per-round ratios (overlay against the stock runs around it).
    round_ratio_min: f64,
    round_ratio_max: f64,
    /// The sweep's and --also's settings ("overlay without NAME", "overlay with ENV=VALUE"),
    /// median tok/s.
    variants: Vec<(String, f64)>,
    /// Generation only: tok/s × bytes per token / read bandwidth.
    overlay_floor_share: Option<f64>,
    stock_floor_share: Option<f64>,
}

#[derive(Debug, Serialize)]
struct BenchResult {
    date: String,
    commit: String,
    model: String,
    bytes_per_token: f64,
    bandwidth: Bandwidth,
    command: String,
    reps: u32,
    rounds: u32,
    split: Split,
    /// The overlay's switches in the environment (`FRT_*`, `GGML_FLASHRT_*`, `GGML_CUDA_FLASHRT_*`):
    /// every run inherits them, and they change what the overlay runs.
    switches: Vec<(String, String)>,
    tests: Vec<TestResult>,
}

/// The overlay's switches as `KEY=VALUE` (result names, where result_stem makes them file-safe,
/// and the profile's header).
pub fn switch_tags(switches: &[(String, String)]) -> impl Iterator<Item = String> + '_ {
    switches.iter().map(|(k, v)| format!("{k}={v}"))
}

/// The overlay's switches among `vars` (an environment), sorted.
pub fn overlay_switches(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("FRT_")
                || k.starts_with("GGML_FLASHRT_")
                || k.starts_with("GGML_CUDA_FLASHRT_")
        })
        .collect();
    out.sort();
    out
}

/// Runs one of llama.cpp's tools with extra environment variables; returns (stdout, stderr). A
/// failure reports the tool's last lines.
pub fn run_tool<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(
    bin: &Path,
    args: &[std::ffi::OsString],
    env: impl IntoIterator<Item = (K, V)>,
) -> Result<(String, String)> {
    let out = std::process::Command::new(bin)
        .args(args)
        .envs(env)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        let name = bin.file_name().unwrap_or_default().to_string_lossy();
        bail!("{name} failed ({}):\n{tail}", out.status);
    }
    Ok((stdout, stderr))
}

pub fn llama_bench(
    bin: &Path,
    model: &Path,
    test: &TestSpec,
    reps: u32,
    split: &Split,
    env: &[(String, String)],
) -> Result<Vec<f64>> {
    let mut args: Vec<std::ffi::OsString> = vec!["-m".into(), model.into()];
    for a in [
        "-ngl",
        "99",
        "-fa",
        "1",
        "-r",
        &reps.to_string(),
        "-o",
        "jsonl",
    ] {
        args.push(a.into());
    }
    args.extend(test.llama_bench_args().into_iter().map(Into::into));
    args.extend(split.llama_bench_args().into_iter().map(Into::into));
    let (stdout, _) = run_tool(bin, &args, env.iter().map(|(k, v)| (k, v)))?;
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("llama-bench printed no result")?;
    let row: serde_json::Value = serde_json::from_str(line).context("parsing llama-bench jsonl")?;
    let samples: Vec<f64> = row["samples_ts"]
        .as_array()
        .context("llama-bench result has no samples_ts")?
        .iter()
        .filter_map(serde_json::Value::as_f64)
        .collect();
    if samples.is_empty() {
        bail!("llama-bench reported no samples");
    }
    Ok(samples)
}

pub fn measure_bandwidth(sh: &Shell, project: &Project, build_dir: &Path) -> Result<Bandwidth> {
    let cuda = toolchain::cuda(sh, project, Provision::Install, CudaChoice::Machine)?;
    let nvcc = &cuda.nvcc.path;
    let source = project.root.join("bench/tools/bandwidth.cu");
    let exe = build_dir.join("bandwidth");
    cmd!(sh, "{nvcc} -std=c++17 -O2 -o {exe} {source}")
        .quiet()
        .run()
        .context("compiling bench/tools/bandwidth.cu")?;
    let out = cmd!(sh, "{exe}")
        .read()
        .context("measuring the device's bandwidth")?;
    #[derive(serde::Deserialize)]
    struct Line {
        gpu: String,
        read_tbps: f64,
        copy_tbps: f64,
    }
    let line: Line =
        serde_json::from_str(out.trim()).context("parsing the bandwidth probe's output")?;
    Ok(Bandwidth {
        gpu: line.gpu,
        read_tbps: line.read_tbps,
        copy_tbps: line.copy_tbps,
    })
}

pub fn today(sh: &Shell) -> Result<String> {
    Ok(cmd!(sh, "date -u +%F")
        .quiet()
        .read()
        .context("reading the date")?
        .trim()
        .to_owned())
}

/// The checkout's short commit, with -dirty when it has local changes.
/// The commit results are recorded under: FLASHRT_COMMIT when set (a device copy of the tree
/// carries stale git metadata, so the device scripts pass the commit the bundle was made at),
/// else the checkout's HEAD, with -dirty for local changes.
pub fn commit(sh: &Shell, project: &Project) -> String {
    if let Ok(commit) = std::env::var("FLASHRT_COMMIT") {
        if !commit.trim().is_empty() {
            return commit.trim().to_owned();
        }
    }
    let root = &project.root;
    let head = cmd!(sh, "git -C {root} rev-parse --short HEAD")
        .quiet()
        .read()
        .unwrap_or_else(|_| "unknown".into());
    let dirty = cmd!(sh, "git -C {root} status --porcelain")
        .quiet()
        .read()
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    format!("{}{}", head.trim(), if dirty { "-dirty" } else { "" })
}

/// One llama-bench run of the schedule: a setting (its name and switches) in a round.
#[derive(Debug, Clone, PartialEq)]
struct Planned {
    setting: String,
    env: Vec<(String, String)>,
    round: u32,
}

const STOCK: &str = "stock";
const OVERLAY: &str = "overlay";

/// An overlay setting run beside the default in each round: the sweep's "overlay without NAME",
/// --also's "overlay with ENV=VALUE".
#[derive(Debug, Clone, PartialEq)]
struct Variant {
    setting: String,
    env: Vec<(String, String)>,
}

/// The sweep's variants: the overlay without each window.
fn sweep_variants(windows: &[String]) -> Vec<Variant> {
    windows
        .iter()
        .map(|name| Variant {
            setting: format!("overlay without {name}"),
            env: vec![(format!("GGML_FLASHRT_NO_{name}"), "1".into())],
        })
        .collect()
}

/// One --also setting: `ENV=VALUE[,ENV=VALUE...]`.
fn also_variant(text: &str) -> Result<Variant> {
    let env = text
        .split(',')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => bail!("--also {text:?}: {pair:?} is not ENV=VALUE (e.g. --also GGML_FLASHRT_HEAD_KERNEL=0)"),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Variant {
        setting: format!("overlay with {text}"),
        env,
    })
}

/// The order of the runs for one test: per round stock, overlay, then each variant; a last stock
/// run closes the series, so every overlay run has stock runs on both sides.
fn schedule(rounds: u32, variants: &[Variant]) -> Vec<Planned> {
    let disabled = vec![("GGML_CUDA_FLASHRT_DISABLE".to_owned(), "1".to_owned())];
    let stock = |round| Planned {
        setting: STOCK.into(),
        env: disabled.clone(),
        round,
    };
    let mut plan = Vec::new();
    for round in 1..=rounds {
        plan.push(stock(round));
        plan.push(Planned {
            setting: OVERLAY.into(),
            env: Vec::new(),
            round,
        });
        for v in variants {
            plan.push(Planned {
                setting: v.setting.clone(),
                env: v.env.clone(),
                round,
            });
        }
    }
    plan.push(stock(rounds + 1));
    plan
}

/// Median of every sample of `setting` over all rounds.
fn setting_median(runs: &[Run], setting: &str) -> f64 {
    let samples: Vec<f64> = runs
        .iter()
        .filter(|r| r.setting == setting)
        .flat_map(|r| r.samples_ts.iter().copied())
        .collect();
    median(&samples)
}

/// Each round's overlay median against the mean of the stock medians before and after it.
fn round_ratios(runs: &[Run]) -> Vec<f64> {
    let stock: Vec<&Run> = runs.iter().filter(|r| r.setting == STOCK).collect();
    runs.iter()
        .filter(|r| r.setting == OVERLAY)
        .filter_map(|overlay| {
            let before = stock.iter().find(|s| s.round == overlay.round)?;
            let after = stock.iter().find(|s| s.round == overlay.round + 1)?;
            Some(overlay.median_ts / ((before.median_ts + after.median_ts) / 2.0))
        })
        .collect()
}

pub fn run(sh: &Shell, project: &Project, args: BenchArgs) -> Result<()> {
    let tests = args
        .tests
        .iter()
        .map(|t| TestSpec::parse(t))
        .collect::<Result<Vec<_>>>()?;
    let split = Split::from_args(&args)?;
    let prepared = args.target.prepare(sh, project, "bench", "llama-bench")?;
    let bin = prepared.bin("llama-bench");
    let model = prepared.model;
    let bytes = bytes_per_token(&model)?;
    step("measuring the device's bandwidth");
    let bandwidth = measure_bandwidth(sh, project, &prepared.build_dir)?;
    note(format!(
        "{}: read {:.2} TB/s, copy {:.2} TB/s",
        bandwidth.gpu, bandwidth.read_tbps, bandwidth.copy_tbps
    ));

    let mut variants = if args.sweep {
        sweep_variants(&test_backend_ops::window_names(project)?)
    } else {
        Vec::new()
    };
    for text in &args.also {
        variants.push(also_variant(text)?);
    }
    let plan = schedule(args.rounds, &variants);
    let mut results = Vec::new();
    for test in &tests {
        let mut runs = Vec::new();
        for planned in &plan {
            step(format!(
                "{} {} (round {} of {})",
                test.name(),
                planned.setting,
                planned.round.min(args.rounds),
                args.rounds
            ));
            let samples = llama_bench(&bin, &model, test, args.reps, &split, &planned.env)?;
            runs.push(Run {
                setting: planned.setting.clone(),
                env: planned.env.clone(),
                round: planned.round,
                median_ts: median(&samples),
                samples_ts: samples,
            });
        }
        let stock_ts = setting_median(&runs, STOCK);
        let overlay_ts = setting_median(&runs, OVERLAY);
        let ratios = round_ratios(&runs);
        let share = |ts: f64| {
            test.generate
                .then(|| ts * bytes / (bandwidth.read_tbps * 1e12))
        };
        let variant_ts: Vec<(String, f64)> = variants
            .iter()
            .map(|v| (v.setting.clone(), setting_median(&runs, &v.setting)))
            .collect();
        results.push(TestResult {
            test: test.name(),
            stock_ts,
            overlay_ts,
            ratio: overlay_ts / stock_ts,
            round_ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            round_ratio_max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            overlay_floor_share: share(overlay_ts),
            stock_floor_share: share(stock_ts),
            variants: variant_ts,
            runs,
        });
    }

    let result = BenchResult {
        date: today(sh)?,
        commit: commit(sh, project),
        model: model.display().to_string(),
        bytes_per_token: bytes,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        reps: args.reps,
        rounds: args.rounds,
        bandwidth,
        split,
        switches: overlay_switches(std::env::vars()),
        tests: results,
    };
    // Runs with switches set are named by them, so that they do not overwrite the default's.
    let mut tags = result.split.tags();
    tags.extend(switch_tags(&result.switches));
    let file = project.root.join("bench/results").join(result_file_name(
        &result.date,
        &result.commit,
        &result.bandwidth.gpu,
        &tags,
        "json",
    ));
    write_atomic(&file, serde_json::to_string_pretty(&result)?.as_bytes())?;
    print!("{}", table(&result));
    println!("\nresults: {}", file.display());
    Ok(())
}

/// `<date>-<commit>-<gpu>[-<tag>…].<ext>` for bench/results: tags keep runs of the same day and
/// commit that differ in setup (split mode, what was measured) from overwriting each other.
pub fn result_file_name(date: &str, commit: &str, gpu: &str, tags: &[String], ext: &str) -> String {
    format!("{}.{ext}", result_stem(date, commit, gpu, tags))
}

/// `<date>-<commit>-<gpu>[-<tag>…]`: [`result_file_name`] without the extension, also the name
/// of a results directory.
pub fn result_stem(date: &str, commit: &str, gpu: &str, tags: &[String]) -> String {
    let gpu_slug = gpu
        .to_lowercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let mut name = format!("{date}-{commit}-{gpu_slug}");
    for tag in tags {
        name.push('-');
        name.push_str(&tag.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_"));
    }
    name
}

fn table(r: &BenchResult) -> String {
    let pct = |x: Option<f64>| {
        x.map(|v| format!("{:.1}%", v * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    let mut split = String::new();
    if let Some(mode) = r.split.mode {
        split.push_str(&format!(" · split {}", mode.name()));
    }
    if !r.split.tensor_split.is_empty() {
        split.push_str(&format!(" · tensor split {}", r.split.tensor_split_text()));
    }
    for (k, v) in &r.switches {
        split.push_str(&format!(" · {k}={v}"));
    }
    let mut out = format!(
        "\n{} · {} · {:.3} GB/token · read {:.2} TB/s · floor {:.0} tok/s{split} · {} round(s) of {} reps\n\n| test | stock tok/s | overlay tok/s | ratio | ratio per round | floor share stock | floor share overlay |\n|---|---:|---:|---:|---:|---:|---:|\n",
        r.bandwidth.gpu,
        r.model,
        r.bytes_per_token / 1e9,
        r.bandwidth.read_tbps,
        r.bandwidth.read_tbps * 1e12 / r.bytes_per_token,
        r.rounds,
        r.reps
    );
    for t in &r.tests {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.3} | {:.3}–{:.3} | {} | {} |\n",
            t.test,
            t.stock_ts,
            t.overlay_ts,
            t.ratio,
            t.round_ratio_min,
            t.round_ratio_max,
            pct(t.stock_floor_share),
            pct(t.overlay_floor_share)
        ));
        for (setting, ts) in &t.variants {
            out.push_str(&format!(
                "| {} {setting} | | {ts:.1} | {:.3} | {:+.1}% against the default | | |\n",
                t.test,
                ts / t.stock_ts,
                (ts / t.overlay_ts - 1.0) * 100.0
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlays_switches_are_picked_from_the_environment() {
        let vars = [
            ("PATH", "/bin"),
            ("FRT_ROUTER_SWAP", "1"),
            ("GGML_FLASHRT_NO_GDN", "1"),
            ("GGML_CUDA_FLASHRT_DISABLE", "0"),
            ("GGML_CUDA_GRAPH_OPT", "1"),
            ("FRT_MOE_TAIL_SWAP", "1"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let picked: Vec<String> = overlay_switches(vars).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            picked,
            [
                "FRT_MOE_TAIL_SWAP",
                "FRT_ROUTER_SWAP",
                "GGML_CUDA_FLASHRT_DISABLE",
                "GGML_FLASHRT_NO_GDN"
            ]
        );
        assert!(overlay_switches([("HOME".to_owned(), "/root".to_owned())]).is_empty());
    }

    #[test]
    fn test_specs_parse_and_map_to_llama_bench_flags() {
        let t = TestSpec::parse("tg128@d8192").unwrap();
        assert_eq!(
            t,
            TestSpec {
                generate: true,
                n: 128,
                depth: 8192
            }
        );
        assert_eq!(t.name(), "tg128@d8192");
        assert_eq!(t.llama_bench_args(), ["-p", "0", "-n", "128", "-d", "8192"]);
        assert_eq!(
            TestSpec::parse("pp512").unwrap().llama_bench_args(),
            ["-p", "512", "-n", "0", "-d", "0"]
        );
        for bad in ["tg", "qq128", "tg12x", "pp512@d", "tg128@x5"] {
            assert!(TestSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn run_tool_passes_env_and_reports_failures_with_their_last_lines() {
        let sh = Path::new("sh");
        let args = |script: &str| vec!["-c".into(), script.into()];
        let (out, err) =
            run_tool(sh, &args("echo $FRT_X; echo note >&2"), [("FRT_X", "1")]).unwrap();
        assert_eq!((out.as_str(), err.as_str()), ("1\n", "note\n"));
        let failure = run_tool(
            sh,
            &args("echo first >&2; echo last >&2; exit 3"),
            [("A", "B")],
        )
        .unwrap_err();
        let text = format!("{failure:#}");
        assert!(
            text.contains("sh failed") && text.contains("first\nlast"),
            "{text}"
        );
    }

    #[test]
    fn split_flags_map_to_llama_bench_and_to_distinct_file_names() {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: BenchArgs,
        }
        let split = |argv: &[&str]| {
            let args = Wrap::try_parse_from(["bench"].iter().chain(argv)).map(|w| w.args)?;
            Split::from_args(&args)
        };
        let none = split(&[]).unwrap();
        assert!(none.llama_bench_args().is_empty() && none.tags().is_empty());
        let tensor = split(&["--split-mode", "tensor", "--tensor-split", "1,1"]).unwrap();
        assert_eq!(tensor.llama_bench_args(), ["-sm", "tensor", "-ts", "1/1"]);
        let layer = split(&["--split-mode", "layer", "--tensor-split", "3,0.5"]).unwrap();
        assert_eq!(layer.llama_bench_args(), ["-sm", "layer", "-ts", "3/0.5"]);
        assert_eq!(
            split(&["--split-mode", "row"]).unwrap().llama_bench_args(),
            ["-sm", "row"]
        );
        assert!(split(&["--split-mode", "columns"]).is_err());
        assert!(split(&["--tensor-split", "1,-1"]).is_err());
        assert!(split(&["--tensor-split", "1,x"]).is_err());

        let name =
            |s: &Split| result_file_name("2026-11-29", "abc1234", "NVIDIA H200", &s.tags(), "json");
        assert_eq!(name(&none), "2026-11-29-abc1234-nvidia-h200.json");
        assert_eq!(
            name(&tensor),
            "2026-11-29-abc1234-nvidia-h200-split-tensor-ts1-1.json"
        );
        assert_eq!(
            name(&layer),
            "2026-11-29-abc1234-nvidia-h200-split-layer-ts3-0_5.json"
        );
    }

    fn run(setting: &str, round: u32, samples: &[f64]) -> Run {
        Run {
            setting: setting.into(),
            env: Vec::new(),
            round,
            samples_ts: samples.to_vec(),
            median_ts: median(samples),
        }
    }

    #[test]
    fn the_schedule_interleaves_rounds_and_closes_with_stock() {
        let names = |plan: &[Planned]| -> Vec<String> {
            plan.iter()
                .map(|p| format!("{}@{}", p.setting, p.round))
                .collect()
        };
        assert_eq!(
            names(&schedule(1, &[])),
            ["stock@1", "overlay@1", "stock@2"]
        );
        let plan = schedule(2, &sweep_variants(&["GDN".to_owned()]));
        assert_eq!(
            names(&plan),
            [
                "stock@1",
                "overlay@1",
                "overlay without GDN@1",
                "stock@2",
                "overlay@2",
                "overlay without GDN@2",
                "stock@3"
            ]
        );
        assert_eq!(
            plan[0].env,
            [("GGML_CUDA_FLASHRT_DISABLE".to_owned(), "1".to_owned())]
        );
        assert!(plan[1].env.is_empty());
        assert_eq!(
            plan[2].env,
            [("GGML_FLASHRT_NO_GDN".to_owned(), "1".to_owned())]
        );
    }

    #[test]
    fn also_settings_run_beside_the_default_and_bad_ones_are_refused() {
        let v = also_variant("GGML_FLASHRT_HEAD_KERNEL=0,FRT_STATS=1").unwrap();
        assert_eq!(
            v.setting,
            "overlay with GGML_FLASHRT_HEAD_KERNEL=0,FRT_STATS=1"
        );
        assert_eq!(
            v.env,
            [
                ("GGML_FLASHRT_HEAD_KERNEL".to_owned(), "0".to_owned()),
                ("FRT_STATS".to_owned(), "1".to_owned())
            ]
        );
        let plan = schedule(1, &[v]);
        let names: Vec<&str> = plan.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            names,
            [
                "stock",
                "overlay",
                "overlay with GGML_FLASHRT_HEAD_KERNEL=0,FRT_STATS=1",
                "stock"
            ]
        );
        for bad in ["GGML_FLASHRT_HEAD_KERNEL", "=1", "A=1,B"] {
            let err = also_variant(bad).unwrap_err().to_string();
            assert!(err.contains("is not ENV=VALUE"), "{bad}: {err}");
        }
    }

    #[test]
    fn rounds_pool_samples_and_ratio_against_neighbouring_stock_runs() {
        let runs = [
            run(STOCK, 1, &[100.0, 102.0]),
            run(OVERLAY, 1, &[110.0, 112.0]),
            run(STOCK, 2, &[96.0, 98.0]),
            run(OVERLAY, 2, &[100.0, 102.0]),
            run(STOCK, 3, &[100.0, 102.0]),
        ];
        assert_eq!(setting_median(&runs, STOCK), 100.0);
        assert_eq!(setting_median(&runs, OVERLAY), 106.0);
        let ratios = round_ratios(&runs);
        assert_eq!(ratios.len(), 2);
        assert!((ratios[0] - 111.0 / 99.0).abs() < 1e-12, "{ratios:?}");
        assert!((ratios[1] - 101.0 / 99.0).abs() < 1e-12, "{ratios:?}");
        // An overlay run without a closing stock run has no ratio.
        assert_eq!(round_ratios(&runs[..4]).len(), 1);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn bytes_per_token_from_the_header_matches_synth() {
        let dir = tempfile::tempdir().unwrap();
        for mtp in [false, true] {
            let model = synth::Model::build(Preset::Qwen36_35bA3b, Some(2), Some(16), mtp).unwrap();
            let path = dir.path().join("m.gguf");
            synth::write_header_only(&model, &path).unwrap();
            let from_header = bytes_per_token(&path).unwrap();
            assert!(
                (from_header - model.bytes_per_token()).abs() < 1.0,
                "mtp {mtp}: {from_header} vs {}",
                model.bytes_per_token()
            );
        }
    }
}
