//! `cargo xtask profile`: where decode time goes, kernel by kernel, stock vs overlay. llama-bench
//! runs under a CUPTI injection library (bench/tools/cupti-trace.cpp) for each setting; the
//! traces are cut into decode steps (CUDA graph launches) and summed per kernel family, with the
//! bytes the matvec kernels read. The instrument every window's README row and perf note cite.

mod kernel_name;
mod launch_log;
mod periods;
mod report;
mod trace;
mod weights;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::bench::{self, Bandwidth, GpuModelArgs, Split, TestSpec};
use crate::gguf;
use crate::parity;
use crate::project::{note, step, write_atomic, Project};
use crate::test_backend_ops;
use crate::toolchain::{self, CudaChoice, Provision};

#[derive(Debug, Args)]
#[command(after_help = "\
Each setting runs llama-bench (-ngl 99 -fa 1 -p 0 -n TOKENS, and -d DEPTH with --depth) three \
times in its own process: \
without tracing (3 repetitions: the tok/s to quote; GGML_FLASHRT_PERIODS has the overlay's hook \
note each graph compute call's host time, stock's too, so the untraced step period is known: its \
median, its mean, what the first steps of a repetition cost), under bench/tools/cupti-trace.cpp, a CUPTI \
injection library (CUDA_INJECTION64_PATH) that records every kernel, memcpy and memset, CUDA \
graph replays included (1 repetition; tracing slows the run, kernel durations hold), and under \
the same library at graph level (FRT_CUPTI_LEVEL=graphs: one record a graph launch, with the \
copies and the CUDA runtime calls, whose records slow the host a little): the step's GPU span \
without per-kernel tracing and the time between steps, host work and copies. Settings: \
stock (GGML_CUDA_FLASHRT_DISABLE=1), overlay, and with --window-off NAME the overlay with \
GGML_FLASHRT_NO_<NAME>=1.

A decode step is one CUDA graph launch (its kernels carry the launch's correlation id); the \
steady steps have the most common kernel count, less the first (a cold replay): warm-up and \
prompt steps have other counts. Per steady step: kernels, span, busy (the union of everything \
that ran) and idle time, and per kernel family (the function's name, templates dropped, \
function arguments kept: k_bin_bcast<op_add>) launches, exclusive µs (each kernel from the \
later of its start and the end of everything before it: kernels overlap under programmatic \
dependent launch; the families sum to the busy time), share and µs each. Kernels named frt_* \
are put under their window by overlay/window-kernels.toml.

Matvec launches (mul_mat_vec_q, mul_mat_vec_f) are attributed to the GGUF's tensors from their \
template arguments (weight type, fusion) and grid (rows, experts), and rated in TB/s against the \
read bandwidth bench/tools/bandwidth.cu measures; launches that cannot be told apart are listed \
with the reason (xtask/src/profile/weights.rs documents the mapping). The GEMV windows' kernels \
(one block an SM: their grid tells nothing) are attributed from the overlay's launch log, which \
the traced overlay runs write (GGML_FLASHRT_LAUNCH_LOG): the k-th such kernel of a step is the \
k-th launch of the capture it replays (xtask/src/profile/launch_log.rs).

Writes bench/results/<date>-<commit>-<gpu>-profile[-dDEPTH][-no-NAME][-SWITCH_VALUE...]/profile.md, \
profile.json and profile.svg (µs per family, one bar per setting); the overlay's switches set in \
the environment (FRT_*, GGML_FLASHRT_*, GGML_CUDA_FLASHRT_*) apply to every run, name the \
directory and head profile.md, so that a run under other switches keeps the default's results. \
--save-traces DIR keeps the traces and the run's other inputs; --from-traces DIR analyses them \
again anywhere, without a GPU.")]
pub struct ProfileArgs {
    #[command(flatten)]
    pub target: GpuModelArgs,
    /// Tokens decoded per llama-bench run (its -n).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(8..))]
    pub tokens: u32,
    /// Tokens already in the context when decoding starts (llama-bench's -d), e.g. 8192 to see
    /// where a long cache's decode time goes. The depth prompt runs before the first timed
    /// repetition (llama-bench restores its state before the others), outside CUDA graphs: the
    /// decode steps are found as without it.
    #[arg(long, default_value_t = 0, value_name = "TOKENS")]
    pub depth: u32,
    /// Also profile the overlay with this window off (GGML_FLASHRT_NO_<NAME>=1): a third column.
    #[arg(long, value_name = "NAME")]
    pub window_off: Option<String>,
    /// Keep the traces and inputs.json in DIR, for --from-traces.
    #[arg(long, value_name = "DIR")]
    pub save_traces: Option<PathBuf>,
    /// Analyse what --save-traces kept in DIR instead of running anything (no GPU needed).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["model", "window_off", "save_traces", "depth"])]
    pub from_traces: Option<PathBuf>,
}

/// overlay/window-kernels.toml: each window's kernels, by name prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct WindowKernels {
    prefixes: BTreeMap<String, Vec<String>>,
}

const WINDOW_KERNELS: &str = "overlay/window-kernels.toml";

impl WindowKernels {
    pub fn load(project: &Project) -> Result<WindowKernels> {
        let path = project.root.join(WINDOW_KERNELS);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        WindowKernels::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<WindowKernels> {
        Ok(toml::from_str(text)?)
    }

    /// The window a kernel (its function name) belongs to. A kernel that several windows launch
    /// (the decode GEMV) is put under all of them, joined by `+` (`--window-off` separates them).
    /// An overlay kernel (frt_*) that no window lists gets a name that says so.
    pub fn window_of(&self, function: &str) -> Option<String> {
        let listed: Vec<&str> = self
            .prefixes
            .iter()
            .filter(|(_, prefixes)| {
                prefixes
                    .iter()
                    .any(|p| !p.is_empty() && function.starts_with(p.as_str()))
            })
            .map(|(window, _)| window.as_str())
            .collect();
        if !listed.is_empty() {
            Some(listed.join("+"))
        } else if function.starts_with("frt_") {
            Some(format!("? (not in {WINDOW_KERNELS})"))
        } else {
            None
        }
    }
}

/// Everything a profile is computed from besides the traces; inputs.json under --save-traces.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inputs {
    pub date: String,
    pub commit: String,
    pub gpu: String,
    pub model: String,
    pub command: String,
    pub tokens: u32,
    /// llama-bench's -d (none in profiles saved before it: 0).
    #[serde(default)]
    pub depth: u32,
    pub bytes_per_token: f64,
    pub bandwidth: Bandwidth,
    pub tensors: Vec<weights::WeightTensor>,
    pub window_off: Option<String>,
    /// The overlay's switches in the environment when traced (`FRT_*`, `GGML_FLASHRT_*`,
    /// `GGML_CUDA_FLASHRT_*`): every run inherits them, so they name the results.
    #[serde(default)]
    pub switches: Vec<(String, String)>,
    pub settings: Vec<SettingRun>,
}

/// One setting's two llama-bench runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettingRun {
    pub name: String,
    pub env: Vec<(String, String)>,
    pub unprofiled_ts: Vec<f64>,
    pub profiled_ts: Vec<f64>,
    /// The trace's file name, next to inputs.json.
    pub trace: String,
    /// The overlay's launch log of the traced run (GGML_FLASHRT_LAUNCH_LOG), next to inputs.json;
    /// none for stock.
    #[serde(default)]
    pub launch_log: Option<String>,
    /// The graph-level trace's file name and its run's tok/s (none in profiles saved before it).
    #[serde(default)]
    pub graph_trace: Option<String>,
    #[serde(default)]
    pub graph_ts: Vec<f64>,
    /// The untraced run's GGML_FLASHRT_PERIODS file (none in profiles saved before it).
    #[serde(default)]
    pub periods: Option<String>,
}

const INPUTS: &str = "inputs.json";
const UNPROFILED_REPS: u32 = 3;
const PROFILED_REPS: u32 = 1;
/// Where the injection library writes its trace.
const TRACE_ENV: &str = "FRT_CUPTI_TRACE";
/// The injection library's level: kernels (its default) or graphs.
const LEVEL_ENV: &str = "FRT_CUPTI_LEVEL";
/// Where the overlay notes each graph compute call's host time (overlay/diagnostics.cuh).
const PERIODS_ENV: &str = "GGML_FLASHRT_PERIODS";
/// Where the overlay logs its windows' weight-reading launches (overlay/diagnostics.cuh).
const LAUNCH_LOG_ENV: &str = "GGML_FLASHRT_LAUNCH_LOG";

/// The settings, each with every switch set explicitly so that one inherited from the caller's
/// environment cannot blur the comparison.
fn settings(window_off: Option<&str>) -> Vec<(String, Vec<(String, String)>)> {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut out = vec![
        (
            "stock".to_owned(),
            env(&[("GGML_CUDA_FLASHRT_DISABLE", "1")]),
        ),
        (
            "overlay".to_owned(),
            env(&[("GGML_CUDA_FLASHRT_DISABLE", "0")]),
        ),
    ];
    if let Some(name) = window_off {
        let switch = format!("GGML_FLASHRT_NO_{name}");
        out.push((
            format!("overlay without {name}"),
            env(&[("GGML_CUDA_FLASHRT_DISABLE", "0"), (&switch, "1")]),
        ));
    }
    out
}

/// The results directory's name tags: a run at a depth or under other switches must not
/// overwrite the default's results of the same day and commit.
fn tags(depth: u32, window_off: Option<&str>, switches: &[(String, String)]) -> Vec<String> {
    let mut tags = vec!["profile".to_owned()];
    tags.extend((depth > 0).then(|| format!("d{depth}")));
    tags.extend(window_off.map(|name| format!("no-{name}")));
    tags.extend(bench::switch_tags(switches));
    tags
}

pub fn run(sh: &Shell, project: &Project, args: ProfileArgs) -> Result<()> {
    let windows = WindowKernels::load(project)?;
    let (inputs, dir, _scratch) = match &args.from_traces {
        Some(dir) => {
            let path = dir.join(INPUTS);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "reading {} (written by `cargo xtask profile --save-traces {}`)",
                    path.display(),
                    dir.display()
                )
            })?;
            let inputs: Inputs = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            (inputs, dir.clone(), None)
        }
        None => measure(sh, project, &args)?,
    };
    step("reading the traces");
    let traces = inputs
        .settings
        .iter()
        .map(|s| {
            let path = dir.join(&s.trace);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading the {} trace {}", s.name, path.display()))?;
            trace::parse(&text).with_context(|| format!("the {} trace {}", s.name, path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    // A launch log the run did not write (no GEMV window launched) leaves those kernels without
    // bytes, and the report says so.
    let launches = inputs
        .settings
        .iter()
        .map(|s| {
            let Some(log) = &s.launch_log else {
                return Ok(None);
            };
            let path = dir.join(log);
            if !path.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading the {} launch log {}", s.name, path.display()))?;
            launch_log::parse(&text)
                .map(Some)
                .with_context(|| format!("the {} launch log {}", s.name, path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let graph_traces = inputs
        .settings
        .iter()
        .map(|s| {
            let Some(file) = &s.graph_trace else {
                return Ok(None);
            };
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "reading the {} graph-level trace {}",
                    s.name,
                    path.display()
                )
            })?;
            trace::parse(&text)
                .map(Some)
                .with_context(|| format!("the {} graph-level trace {}", s.name, path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    // The untraced runs' periods; a file the run did not write (a build without the mark) or
    // calls that do not split into the repetitions leave the rows empty, and the report says why.
    let periods: Vec<Result<periods::Periods, String>> = inputs
        .settings
        .iter()
        .map(|s| {
            let file = s
                .periods
                .as_ref()
                .ok_or("the profile was saved without them")?;
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "{}: {e} (a build without GGML_FLASHRT_PERIODS?)",
                    path.display()
                )
            })?;
            periods::parse(&text)
                .and_then(|marks| {
                    periods::summarise(
                        &marks,
                        inputs.tokens as usize,
                        UNPROFILED_REPS as usize,
                        inputs.depth > 0,
                    )
                })
                .map_err(|e| format!("{}: {e:#}", path.display()))
        })
        .collect();
    let mut profile = report::analyse(&inputs, &traces, &graph_traces, &launches, &windows)?;
    for (setting, periods) in profile.settings.iter_mut().zip(periods) {
        match periods {
            Ok(p) => setting.periods = Some(p),
            Err(why) => setting.periods_missing = Some(why),
        }
    }
    let out = project.root.join("bench/results").join(bench::result_stem(
        &inputs.date,
        &inputs.commit,
        &inputs.gpu,
        &tags(inputs.depth, inputs.window_off.as_deref(), &inputs.switches),
    ));
    let markdown = report::markdown(&profile);
    write_atomic(&out.join("profile.md"), markdown.as_bytes())?;
    write_atomic(
        &out.join("profile.json"),
        serde_json::to_string_pretty(&profile)?.as_bytes(),
    )?;
    write_atomic(&out.join("profile.svg"), report::svg(&profile).as_bytes())?;
    for setting in &profile.settings {
        write_atomic(
            &out.join(format!("timeline-{}.tsv", setting.name)),
            report::timeline_tsv(setting).as_bytes(),
        )?;
    }
    print!("\n{markdown}");
    println!("\nresults: {}", out.display());
    Ok(())
}

/// Runs every setting with and without tracing; returns the inputs, the directory holding the
/// traces, and the scratch directory that holds it when the traces are not kept.
fn measure(
    sh: &Shell,
    project: &Project,
    args: &ProfileArgs,
) -> Result<(Inputs, PathBuf, Option<tempfile::TempDir>)> {
    if let Some(name) = &args.window_off {
        let known = test_backend_ops::window_names(project)?;
        if !known.contains(name) {
            bail!(
                "--window-off {name}: no such window (overlay/registry.cu has {})",
                known.join(", ")
            );
        }
    }
    let prepared = args.target.prepare(sh, project, "profile", "llama-bench")?;
    let library = injection_library(sh, project, &prepared.build_dir)?;
    step("measuring the device's bandwidth");
    let bandwidth = bench::measure_bandwidth(sh, project, &prepared.build_dir)?;
    note(format!(
        "{}: read {:.2} TB/s, copy {:.2} TB/s",
        bandwidth.gpu, bandwidth.read_tbps, bandwidth.copy_tbps
    ));
    let header = gguf::read_header(&prepared.model)?;
    let (dir, scratch) = match &args.save_traces {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            (std::path::absolute(dir)?, None)
        }
        None => {
            let scratch = project.scratch()?;
            (scratch.path().to_path_buf(), Some(scratch))
        }
    };
    let test = TestSpec::parse(&report::test_name(args.tokens, args.depth))?;
    let bin = prepared.bin("llama-bench");
    let utf8 = |path: &Path| -> Result<String> {
        path.to_str()
            .map(str::to_owned)
            .with_context(|| format!("{} is not UTF-8: use another directory", path.display()))
    };
    let mut runs = Vec::new();
    for (name, env) in settings(args.window_off.as_deref()) {
        step(format!("{name}: llama-bench {}", test.name()));
        let (periods_file, periods_path) = fresh_file(&dir, &name, "periods")?;
        let mut untraced = env.clone();
        untraced.push((PERIODS_ENV.into(), utf8(&periods_path)?));
        let unprofiled_ts = bench::llama_bench(
            &bin,
            &prepared.model,
            &test,
            UNPROFILED_REPS,
            &Split::default(),
            &untraced,
        )
        .with_context(|| format!("the {name} run"))?;
        let (file, path) = fresh_file(&dir, &name, "trace")?;
        let mut traced = env.clone();
        traced.push(("CUDA_INJECTION64_PATH".into(), utf8(&library)?));
        traced.push((TRACE_ENV.into(), utf8(&path)?));
        let overlay = env
            .iter()
            .any(|(k, v)| k == "GGML_CUDA_FLASHRT_DISABLE" && v == "0");
        let launch_log = if overlay {
            let (log, log_path) = fresh_file(&dir, &name, "launches")?;
            traced.push((LAUNCH_LOG_ENV.into(), utf8(&log_path)?));
            Some(log)
        } else {
            None
        };
        step(format!("{name}: llama-bench {} traced", test.name()));
        let profiled_ts = bench::llama_bench(
            &bin,
            &prepared.model,
            &test,
            PROFILED_REPS,
            &Split::default(),
            &traced,
        )
        .with_context(|| format!("the traced {name} run"))?;
        if !path.is_file() {
            bail!(
                "the traced {name} run wrote no trace to {}: the CUDA driver did not load {} \
                 (CUDA_INJECTION64_PATH); run llama-bench with both variables set to see why",
                path.display(),
                library.display()
            );
        }
        let (graph_file, graph_path) = fresh_file(&dir, &name, "graphs.trace")?;
        let mut graph_traced = env.clone();
        graph_traced.push(("CUDA_INJECTION64_PATH".into(), utf8(&library)?));
        graph_traced.push((TRACE_ENV.into(), utf8(&graph_path)?));
        graph_traced.push((LEVEL_ENV.into(), "graphs".into()));
        step(format!(
            "{name}: llama-bench {} traced at graph level",
            test.name()
        ));
        let graph_ts = bench::llama_bench(
            &bin,
            &prepared.model,
            &test,
            PROFILED_REPS,
            &Split::default(),
            &graph_traced,
        )
        .with_context(|| format!("the {name} run traced at graph level"))?;
        if !graph_path.is_file() {
            bail!(
                "the {name} run traced at graph level wrote no trace to {}",
                graph_path.display()
            );
        }
        runs.push(SettingRun {
            name,
            env,
            unprofiled_ts,
            profiled_ts,
            trace: file,
            launch_log,
            graph_trace: Some(graph_file),
            graph_ts,
            periods: Some(periods_file),
        });
    }
    let inputs = Inputs {
        date: bench::today(sh)?,
        commit: bench::commit(sh, project),
        gpu: prepared.gpu,
        model: prepared.model.display().to_string(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        tokens: args.tokens,
        depth: args.depth,
        bytes_per_token: bench::bytes_per_token(&prepared.model)?,
        bandwidth,
        tensors: weights::weight_tensors(&header),
        window_off: args.window_off.clone(),
        switches: bench::overlay_switches(std::env::vars()),
        settings: runs,
    };
    if args.save_traces.is_some() {
        write_atomic(
            &dir.join(INPUTS),
            serde_json::to_string_pretty(&inputs)?.as_bytes(),
        )?;
        note(format!("traces and inputs kept in {}", dir.display()));
    }
    Ok((inputs, dir, scratch))
}

/// A setting's file `<name>.<suffix>` in `dir` (spaces as dashes), an older one removed: its name
/// (for inputs.json) and its path.
fn fresh_file(dir: &Path, setting: &str, suffix: &str) -> Result<(String, PathBuf)> {
    let file = format!("{}.{suffix}", setting.replace(' ', "-"));
    let path = dir.join(&file);
    if path.exists() {
        std::fs::remove_file(&path)
            .with_context(|| format!("removing the old {}", path.display()))?;
    }
    Ok((file, path))
}

/// CUPTI's header directory and library file.
#[derive(Debug, PartialEq, Eq)]
struct Cupti {
    include: PathBuf,
    library: PathBuf,
}

/// Where CUPTI lives under a toolkit root: a full toolkit's extras/CUPTI and targets/, or the
/// nvidia-cuda-cupti wheel's include/ and lib/ (nvidia/cu13).
const CUPTI_LAYOUTS: &[(&str, &[&str])] = &[
    (
        "extras/CUPTI/include",
        &["extras/CUPTI/lib64", "extras/CUPTI/lib"],
    ),
    (
        "targets/x86_64-linux/include",
        &["targets/x86_64-linux/lib"],
    ),
    ("targets/sbsa-linux/include", &["targets/sbsa-linux/lib"]),
    ("include", &["lib64", "lib"]),
];

/// $CUDA_HOME, $CUDA_PATH, the toolkit whose nvcc the builds use, /usr/local/cuda.
fn cupti_roots(toolkit: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(toolkit.to_path_buf());
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut unique = Vec::new();
    for root in roots {
        if !unique.contains(&root) {
            unique.push(root);
        }
    }
    unique
}

/// libcupti.so in `dir`, else its highest versioned name (the wheel ships libcupti.so.13 only).
fn cupti_library_in(dir: &Path) -> Option<PathBuf> {
    let plain = dir.join("libcupti.so");
    if plain.is_file() {
        return Some(plain);
    }
    let mut versioned: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libcupti.so."))
        })
        .collect();
    versioned.sort();
    versioned.pop()
}

fn find_cupti(roots: &[PathBuf]) -> Result<Cupti> {
    for root in roots {
        for (include, libs) in CUPTI_LAYOUTS {
            let include = root.join(include);
            if !include.join("cupti.h").is_file() {
                continue;
            }
            if let Some(library) = libs
                .iter()
                .find_map(|lib| cupti_library_in(&root.join(lib)))
            {
                return Ok(Cupti { include, library });
            }
        }
    }
    let looked: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    bail!(
        "CUPTI not found (cupti.h and libcupti.so under extras/CUPTI, targets/*/ or include/ and \
         lib/ of {}): install the toolkit's CUPTI, or `python3 -m pip install --target DIR \
         nvidia-cuda-cupti==13.0.*` and set CUDA_HOME=DIR/nvidia/cu13",
        looked.join(", ")
    )
}

/// Compiles bench/tools/cupti-trace.cpp into `<build>/libflashrt-cupti-trace.so` with the build's
/// C++ compiler against the toolkit's CUPTI (cupti.h needs the toolkit's cuda.h). Skipped while
/// the library is newer than its source and libcupti.
fn injection_library(sh: &Shell, project: &Project, build_dir: &Path) -> Result<PathBuf> {
    let source = project.root.join("bench/tools/cupti-trace.cpp");
    let cuda = toolchain::cuda(sh, project, Provision::Install, CudaChoice::Machine)?;
    let cupti = find_cupti(&cupti_roots(&cuda.root))?;
    let library = build_dir.join("libflashrt-cupti-trace.so");
    if !parity::is_stale(&library, &[&source, &cupti.library])? {
        return Ok(library);
    }
    let (cxx, _) = parity::cmake_cxx_compiler(build_dir)?;
    let mut includes = vec![cupti.include.clone()];
    for dir in [
        cuda.root.join("include"),
        cuda.root.join("targets/x86_64-linux/include"),
        cuda.root.join("targets/sbsa-linux/include"),
    ] {
        if dir.join("cuda.h").is_file() && !includes.contains(&dir) {
            includes.push(dir);
        }
    }
    let includes: Vec<String> = includes
        .iter()
        .map(|d| format!("-I{}", d.display()))
        .collect();
    let cupti_library = &cupti.library;
    let cupti_dir = cupti_library
        .parent()
        .context("libcupti has no directory")?;
    // Through a temporary name: a failed compile must not leave a library that looks current.
    let partial = build_dir.join("libflashrt-cupti-trace.so.partial");
    step(format!(
        "compiling bench/tools/cupti-trace.cpp against {}",
        cupti_library.display()
    ));
    cmd!(
        sh,
        "{cxx} -std=c++17 -O2 -Wall -Wextra -shared -fPIC {includes...} -o {partial} {source}
            {cupti_library} -Wl,-rpath,{cupti_dir}"
    )
    .run()
    .context("compiling bench/tools/cupti-trace.cpp")?;
    std::fs::rename(&partial, &library)
        .with_context(|| format!("renaming {} into place", partial.display()))?;
    Ok(library)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project() -> Project {
        Project {
            root: Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .to_path_buf(),
        }
    }

    #[test]
    fn every_window_lists_its_kernels_and_every_prefix_names_a_vendor_kernel() {
        let project = project();
        let table = WindowKernels::load(&project).unwrap();
        let mut listed: Vec<&String> = table.prefixes.keys().collect();
        let mut registered = test_backend_ops::window_names(&project).unwrap();
        listed.sort();
        registered.sort();
        assert_eq!(
            listed,
            registered.iter().collect::<Vec<_>>(),
            "{WINDOW_KERNELS} must list exactly the windows of overlay/registry.cu"
        );
        // The kernels the vendor sources define (templates live in headers).
        let mut kernels = Vec::new();
        for entry in std::fs::read_dir(project.root.join("vendor/csrc")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "cu" || e == "cuh") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, declaration) in text.match_indices("__global__ void ") {
                    // `__global__ void __launch_bounds__(...) name(`: the name follows the bounds.
                    let mut rest = &text[at + declaration.len()..];
                    if let Some(bounded) = rest.strip_prefix("__launch_bounds__(") {
                        rest = bounded[bounded.find(')').unwrap() + 1..].trim_start();
                    }
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    kernels.push(name);
                }
            }
        }
        assert!(!kernels.is_empty());
        for (window, prefixes) in &table.prefixes {
            assert!(!prefixes.is_empty(), "{window} lists no kernel");
            for prefix in prefixes {
                assert!(
                    prefix.starts_with("frt_") && kernels.iter().any(|k| k.starts_with(prefix)),
                    "{window}: no vendor kernel starts with {prefix:?} (kernels: {kernels:?})"
                );
            }
        }
    }

    #[test]
    fn kernels_map_to_windows_by_prefix() {
        let table = WindowKernels::parse(
            "GDN_GATED_NORM = [\"frt_gated_rms_norm\"]\nSHEXP_GATE = [\"frt_gated_residual\", \"frt_x\"]\n",
        )
        .unwrap();
        assert_eq!(
            table.window_of("frt_gated_rms_norm_f32_kernel").as_deref(),
            Some("GDN_GATED_NORM")
        );
        assert_eq!(table.window_of("frt_x2").as_deref(), Some("SHEXP_GATE"));
        assert_eq!(table.window_of("rms_norm_f32"), None);
        assert!(table
            .window_of("frt_new_kernel")
            .unwrap()
            .contains("not in overlay/window-kernels.toml"));
        assert!(WindowKernels::parse("GDN = \"frt_a\"\n").is_err());
        let shared = WindowKernels::parse(
            "INPROJ = [\"frt_gemv\"]\nHEAD = [\"frt_gemv\"]\nX = [\"frt_x\"]\n",
        )
        .unwrap();
        assert_eq!(
            shared.window_of("frt_gemv_kernel<4>").as_deref(),
            Some("HEAD+INPROJ")
        );
    }

    #[test]
    fn settings_set_every_switch_and_name_their_results() {
        let two = settings(None);
        assert_eq!(
            two.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
            ["stock", "overlay"]
        );
        assert_eq!(
            two[0].1,
            [("GGML_CUDA_FLASHRT_DISABLE".to_owned(), "1".to_owned())]
        );
        let three = settings(Some("SHEXP_GATE"));
        assert_eq!(three[2].0, "overlay without SHEXP_GATE");
        assert_eq!(
            three[2].1,
            [
                ("GGML_CUDA_FLASHRT_DISABLE".to_owned(), "0".to_owned()),
                ("GGML_FLASHRT_NO_SHEXP_GATE".to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(
            bench::result_stem("2026-11-30", "abc1234", "NVIDIA H200", &tags(0, None, &[])),
            "2026-11-30-abc1234-nvidia-h200-profile"
        );
        assert_eq!(
            bench::result_stem(
                "2026-11-30",
                "abc1234",
                "NVIDIA H200",
                &tags(0, Some("SHEXP_GATE"), &[])
            ),
            "2026-11-30-abc1234-nvidia-h200-profile-no-SHEXP_GATE"
        );
        let switched = [("GGML_FLASHRT_ROUTE_X".to_owned(), "0".to_owned())];
        assert_eq!(
            bench::result_stem(
                "2026-11-30",
                "abc1234",
                "NVIDIA H200",
                &tags(0, None, &switched)
            ),
            "2026-11-30-abc1234-nvidia-h200-profile-GGML_FLASHRT_ROUTE_X_0"
        );
        // A run at a depth keeps its own folder, before the other tags.
        assert_eq!(
            bench::result_stem(
                "2026-11-30",
                "abc1234",
                "NVIDIA H200",
                &tags(8192, Some("GDN"), &switched)
            ),
            "2026-11-30-abc1234-nvidia-h200-profile-d8192-no-GDN-GGML_FLASHRT_ROUTE_X_0"
        );
    }

    #[test]
    fn cupti_is_found_in_a_toolkit_or_the_wheel_layout() {
        let dir = tempfile::tempdir().unwrap();
        let touch = |rel: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "").unwrap();
        };
        let roots =
            |names: &[&str]| -> Vec<PathBuf> { names.iter().map(|n| dir.path().join(n)).collect() };
        // Nothing anywhere: the message names the places and the fix.
        let err = format!(
            "{:#}",
            find_cupti(&roots(&["none", "toolkit"])).unwrap_err()
        );
        assert!(
            err.contains("toolkit") && err.contains("nvidia-cuda-cupti==13.0.*"),
            "{err}"
        );
        // The wheel: include/ and lib/libcupti.so.13 only.
        touch("wheel/nvidia/cu13/include/cupti.h");
        touch("wheel/nvidia/cu13/lib/libcupti.so.13");
        touch("wheel/nvidia/cu13/lib/libcupti.so.13.0.85");
        assert_eq!(
            find_cupti(&roots(&["none", "wheel/nvidia/cu13"])).unwrap(),
            Cupti {
                include: dir.path().join("wheel/nvidia/cu13/include"),
                library: dir.path().join("wheel/nvidia/cu13/lib/libcupti.so.13.0.85"),
            }
        );
        // A full toolkit: extras/CUPTI wins over a header-only include/.
        touch("toolkit/include/cupti.h");
        touch("toolkit/extras/CUPTI/include/cupti.h");
        touch("toolkit/extras/CUPTI/lib64/libcupti.so");
        touch("toolkit/extras/CUPTI/lib64/libcupti.so.13");
        assert_eq!(
            find_cupti(&roots(&["toolkit", "wheel/nvidia/cu13"])).unwrap(),
            Cupti {
                include: dir.path().join("toolkit/extras/CUPTI/include"),
                library: dir.path().join("toolkit/extras/CUPTI/lib64/libcupti.so"),
            }
        );
        // A header without a library is passed over.
        touch("headers/include/cupti.h");
        assert!(find_cupti(&roots(&["headers"])).is_err());
        let toolkit = dir.path().join("toolkit");
        let found = cupti_roots(&toolkit);
        assert!(found.contains(&toolkit) && found.contains(&PathBuf::from("/usr/local/cuda")));
    }

    #[test]
    fn saved_traces_are_analysed_again_into_the_same_results() {
        // A minimal saved run: two settings sharing one trace, analysed as --from-traces does.
        let dir = tempfile::tempdir().unwrap();
        let trace = "# flashrt-cupti-trace 1\nn 0 _Z3fooILi1EEvv\n\
            k 0 0 1000 0 7 3 5 1 1 1 32 1 1\nk 0 5000 6000 0 7 4 5 1 1 1 32 1 1\n\
            k 0 10000 11500 0 7 5 5 1 1 1 32 1 1\ne\n";
        std::fs::write(dir.path().join("stock.trace"), trace).unwrap();
        std::fs::write(dir.path().join("overlay.trace"), trace).unwrap();
        let run = |name: &str| SettingRun {
            name: name.into(),
            env: settings(None).into_iter().find(|s| s.0 == name).unwrap().1,
            unprofiled_ts: vec![250.0],
            profiled_ts: vec![160.0],
            trace: format!("{name}.trace"),
            launch_log: None,
            graph_trace: None,
            graph_ts: Vec::new(),
            periods: None,
        };
        let inputs = Inputs {
            date: "2026-11-30".into(),
            commit: "abc1234".into(),
            gpu: "NVIDIA H200".into(),
            model: "m.gguf".into(),
            command: "xtask profile".into(),
            tokens: 64,
            depth: 0,
            bytes_per_token: 2e9,
            bandwidth: Bandwidth {
                gpu: "NVIDIA H200".into(),
                read_tbps: 4.38,
                copy_tbps: 4.28,
            },
            tensors: Vec::new(),
            window_off: None,
            switches: vec![("GGML_FLASHRT_X".into(), "1".into())],
            settings: vec![run("stock"), run("overlay")],
        };
        let text = serde_json::to_string(&inputs).unwrap();
        let back: Inputs = serde_json::from_str(&text).unwrap();
        let traces: Vec<trace::Trace> = back
            .settings
            .iter()
            .map(|s| {
                trace::parse(&std::fs::read_to_string(dir.path().join(&s.trace)).unwrap()).unwrap()
            })
            .collect();
        let profile = report::analyse(
            &back,
            &traces,
            &[None, None],
            &[None, None],
            &WindowKernels::default(),
        )
        .unwrap();
        // Steps of 1 kernel each: three launches, the first left out, 1.0 and 1.5 µs.
        let stock = &profile.settings[0];
        assert_eq!((stock.steady_steps, stock.kernels_per_step), (2, 1));
        assert!((stock.busy_us - 1.25).abs() < 1e-12);
        assert_eq!(stock.period_us, Some(5.0));
        assert_eq!(stock.families[0].family, "foo");
        assert_eq!(profile.settings[1].name, "overlay");
        assert_eq!(
            profile.switches,
            [("GGML_FLASHRT_X".to_owned(), "1".to_owned())]
        );
        // Traces saved before the switches were recorded read back without them.
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("switches");
        let old: Inputs = serde_json::from_value(old).unwrap();
        assert!(old.switches.is_empty());
        // The timeline: the one launch of a step, medians over the two steady steps.
        assert_eq!(stock.timeline.len(), 1);
        let row = &stock.timeline[0];
        assert_eq!(
            (row.family.as_str(), row.grid, row.block),
            ("foo", [1, 1, 1], [32, 1, 1])
        );
        assert!(
            (row.duration_us - 1.25).abs() < 1e-12 && row.start_us == 0.0 && row.early_us == 0.0
        );
        let tsv = report::timeline_tsv(stock);
        assert_eq!(tsv.lines().count(), 2);
        assert!(tsv
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("0\tfoo\t-\t1x1x1\t32x1x1\t-\t0.00\t1.25\t1.25\t0.00"));
    }
}
