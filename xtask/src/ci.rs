//! `cargo xtask ci`: expands ci/matrix.toml into cells (host × arch × flavor × kind, plus the
//! driver's own checks and the vendor kernels' unit tests), runs those this machine can run and
//! says why the others are skipped.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::build::{self, BuildArgs};
use crate::config::{CellKind, Check, Flavor, Matrix};
use crate::doctor;
use crate::fa4_aot;
use crate::patch;
use crate::project::{step, Project};
use crate::serve_check::{self, Load};
use crate::synth::{self, Preset, Quant, SynthArgs};
use crate::test_backend_ops::{self, TestBackendOpsArgs};
use crate::toolchain::{self, Cuda, CudaChoice, Provision};

#[derive(Debug, Args)]
pub struct CiArgs {
    /// Run only these cells (names as --list prints them; a trailing / selects a prefix).
    #[arg(long, value_name = "NAME")]
    pub cell: Vec<String>,
    /// List the cells and whether this machine can run them; run nothing.
    #[arg(long)]
    pub list: bool,
    /// Print the plan or the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Cell {
    pub name: String,
    pub kind: CellKind,
    pub action: Action,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Action {
    /// A check of the driver itself.
    Check { check: Check },
    /// The committed patch series must reproduce byte for byte at the pin.
    PatchCheck { host: String },
    /// Build the host (and, on a GPU, run its tests).
    Build {
        host: String,
        flavor: Flavor,
        arch: Option<String>,
        targets: Vec<String>,
    },
    /// The vendor kernels' unit tests (vendor/csrc/tests/test-*.cu) compiled with nvcc for these
    /// architectures (one per gpu cell, which also runs them).
    VendorTests { archs: Vec<String> },
}

#[derive(Debug, Serialize)]
struct Outcome<'a> {
    #[serde(flatten)]
    cell: &'a Cell,
    result: CellResult,
    /// How long the cell ran; none for a cell that did not run (skipped, or --list).
    #[serde(skip_serializing_if = "Option::is_none")]
    seconds: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "kebab-case")]
enum CellResult {
    Passed,
    Failed(String),
    Skipped(String),
    /// --list: the cell would run here.
    Runnable,
}

/// All cells of the matrix, in run order: checks, then per group its cells. A compile-only or gpu
/// group with the flashrt flavor starts with the vendor kernels' tests for its architectures
/// (seconds to minutes; the builds after them take longer). The compile-only ones are one cell
/// for all architectures: one nvcc call per file compiles them all, in a third of the time.
pub fn expand(matrix: &Matrix) -> Vec<Cell> {
    let mut cells: Vec<Cell> = matrix
        .checks
        .iter()
        .map(|&check| Cell {
            name: check.to_string(),
            kind: CellKind::Cpu,
            action: Action::Check { check },
        })
        .collect();
    let mut patch_checked: Vec<&str> = Vec::new();
    for group in &matrix.groups {
        if group.flavors.contains(&Flavor::Flashrt) && !patch_checked.contains(&group.host.as_str())
        {
            patch_checked.push(&group.host);
            cells.push(Cell {
                name: format!("{}/patch-check", group.host),
                kind: CellKind::Cpu,
                action: Action::PatchCheck {
                    host: group.host.clone(),
                },
            });
        }
        if group.kind != CellKind::Cpu && group.flavors.contains(&Flavor::Flashrt) {
            add_vendor_tests(&mut cells, group.kind, &group.archs);
        }
        let archs: Vec<Option<&String>> = if group.archs.is_empty() {
            vec![None]
        } else {
            group.archs.iter().map(Some).collect()
        };
        for arch in archs {
            for &flavor in &group.flavors {
                let arch_part = arch.map(|a| format!("/sm_{a}")).unwrap_or_default();
                cells.push(Cell {
                    name: format!("{}/{}{arch_part}/{flavor}", group.host, group.kind),
                    kind: group.kind,
                    action: Action::Build {
                        host: group.host.clone(),
                        flavor,
                        arch: arch.cloned(),
                        targets: group.targets.clone(),
                    },
                });
            }
        }
    }
    cells
}

/// Adds a group's vendor test cells, or its architectures to those already there:
/// `vendor/compile-only` (all architectures) or `vendor/gpu/sm_<arch>` (one each).
fn add_vendor_tests(cells: &mut Vec<Cell>, kind: CellKind, archs: &[String]) {
    let per_cell: Vec<(String, &[String])> = match kind {
        CellKind::Gpu => archs
            .iter()
            .map(|arch| {
                (
                    format!("vendor/{kind}/sm_{arch}"),
                    std::slice::from_ref(arch),
                )
            })
            .collect(),
        _ => vec![(format!("vendor/{kind}"), archs)],
    };
    for (name, archs) in per_cell {
        let at = match cells.iter().position(|c| c.name == name) {
            Some(at) => at,
            None => {
                cells.push(Cell {
                    name,
                    kind,
                    action: Action::VendorTests { archs: Vec::new() },
                });
                cells.len() - 1
            }
        };
        if let Action::VendorTests { archs: cell_archs } = &mut cells[at].action {
            for arch in archs {
                if !cell_archs.contains(arch) {
                    cell_archs.push(arch.clone());
                }
            }
        }
    }
}

fn selected(cell: &Cell, filters: &[String]) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| {
            if f.ends_with('/') {
                cell.name.starts_with(f.as_str())
            } else {
                &cell.name == f
            }
        })
}

/// Why this machine cannot run a cell, if it cannot.
fn skip_reason(sh: &Shell, project: &Project, cell: &Cell) -> Option<String> {
    match (cell.kind, &cell.action) {
        (CellKind::Cpu, _) => None,
        (CellKind::CompileOnly, _) => {
            let pinned = toolchain::cuda(sh, project, Provision::LookOnly, CudaChoice::Pinned);
            (pinned.is_err() && which::which("python3").is_err()).then(|| {
                "the pinned CUDA toolkit is not installed and there is no python3 to install it"
                    .to_owned()
            })
        }
        (CellKind::Gpu, action) => {
            let archs: &[String] = match action {
                Action::Build { arch, .. } => arch.as_slice(),
                Action::VendorTests { archs } => archs,
                _ => &[],
            };
            if archs.is_empty() {
                return Some("gpu cells need an architecture".to_owned());
            }
            let gpus = match doctor::gpus(sh) {
                Err(why) => return Some(format!("no NVIDIA GPU visible ({why})")),
                Ok(gpus) => gpus,
            };
            let numbers: Vec<String> = gpus.iter().map(|(_, cc)| cc.replace('.', "")).collect();
            archs.iter().find_map(|arch| {
                let arch_number: String = arch.chars().take_while(char::is_ascii_digit).collect();
                (!numbers.contains(&arch_number)).then(|| {
                    format!(
                        "needs an sm_{arch} GPU; this machine has sm_{}",
                        numbers.join(", sm_")
                    )
                })
            })
        }
    }
}

fn run_cell(sh: &Shell, project: &Project, cell: &Cell) -> Result<()> {
    match &cell.action {
        Action::Check { check } => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let root = &project.root;
            let _dir = sh.push_dir(root);
            match check {
                Check::Fmt => cmd!(sh, "{cargo} fmt --all -- --check").run()?,
                Check::Clippy => cmd!(
                    sh,
                    "{cargo} clippy --workspace --all-targets -- -D warnings"
                )
                .run()?,
                Check::Test => cmd!(sh, "{cargo} test --workspace").run()?,
                Check::OverlayUnit => overlay_unit_tests(sh, project)?,
                Check::Fa4Aot => fa4_aot::check_all(project)?,
            }
            Ok(())
        }
        Action::PatchCheck { host } => patch::check(sh, project, &project.host(host)?, None),
        Action::Build {
            host,
            flavor,
            arch,
            targets,
        } => {
            let args = BuildArgs {
                arch: arch.iter().cloned().collect(),
                stock: *flavor == Flavor::Stock,
                cpu: arch.is_none(),
                targets: targets.clone(),
                overlay_only: cell.kind == CellKind::CompileOnly,
                // Compile-only cells prove the overlay compiles with the pinned nvcc.
                pinned_cuda: cell.kind == CellKind::CompileOnly,
                ..BuildArgs::new(host)
            };
            if cell.kind == CellKind::Gpu {
                // The whole upstream suite plus the FlashRT cases, CUDA against the CPU.
                let tests = TestBackendOpsArgs {
                    full: true,
                    stock: *flavor == Flavor::Stock,
                    arch: arch.clone(),
                    ..TestBackendOpsArgs::new(host)
                };
                return test_backend_ops::run(sh, project, tests);
            }
            let built = build::build(sh, project, &args)?;
            match cell.kind {
                CellKind::Cpu => smoke_cpu(sh, project, &built),
                _ => Ok(()),
            }
        }
        Action::VendorTests { archs } => {
            // Compile-only cells use the pinned nvcc, as the overlay's compile-only builds do;
            // gpu cells the nvcc their build uses.
            let (choice, run) = match cell.kind {
                CellKind::Gpu => (CudaChoice::Machine, true),
                _ => (CudaChoice::Pinned, false),
            };
            let cuda = toolchain::cuda(sh, project, Provision::Install, choice)?;
            vendor_tests(sh, project, &cuda, archs, run)
        }
    }
}

/// The `*.cu` files directly in `dir` whose names start with `prefix`, sorted.
fn cu_files(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_file() && name.starts_with(prefix) && name.ends_with(".cu") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Every vendor/csrc/tests/test-*.cu, linked with all of vendor/csrc/*.cu (so a test may use any
/// kernel family), compiled for `archs` by one nvcc call per file; with `run`, each test is run
/// and must exit with 0.
fn vendor_tests(
    sh: &Shell,
    project: &Project,
    cuda: &Cuda,
    archs: &[String],
    run: bool,
) -> Result<()> {
    let csrc = project.root.join("vendor/csrc");
    let tests = cu_files(&csrc.join("tests"), "test-")?;
    if tests.is_empty() {
        bail!("no unit tests in {}/tests (test-NAME.cu)", csrc.display());
    }
    let kernels = cu_files(&csrc, "")?;
    let nvcc = &cuda.nvcc.path;
    // --threads 0: nvcc compiles the architectures of one file side by side, one a core (the exact
    // GEMV kernel's instances for four architectures took ~18 minutes of two cores one at a time).
    let mut flags = vec![
        "-std=c++17".to_owned(),
        "--threads".to_owned(),
        "0".to_owned(),
    ];
    for arch in archs {
        flags.push(format!(
            "--generate-code=arch=compute_{arch},code=sm_{arch}"
        ));
    }
    if let Some(dir) = cuda.system_include() {
        flags.extend(["-isystem".to_owned(), dir.display().to_string()]);
    }
    flags.extend(["-I".to_owned(), csrc.display().to_string()]);
    let flags = &flags;
    let for_archs = archs
        .iter()
        .map(|a| format!("sm_{a}"))
        .collect::<Vec<_>>()
        .join(", ");
    let scratch = project.scratch()?;
    let mut objects = Vec::new();
    for kernel in &kernels {
        let name = kernel.file_stem().unwrap_or_default().to_string_lossy();
        let object = scratch.path().join(format!("{name}.o"));
        step(format!("compiling {} for {for_archs}", kernel.display()));
        cmd!(sh, "{nvcc} {flags...} -c {kernel} -o {object}")
            .run()
            .with_context(|| format!("compiling {} for {for_archs}", kernel.display()))?;
        objects.push(object);
    }
    let objects = &objects;
    for test in &tests {
        let name = test.file_stem().unwrap_or_default().to_string_lossy();
        let exe = scratch.path().join(name.as_ref());
        step(format!("compiling {} for {for_archs}", test.display()));
        cmd!(sh, "{nvcc} {flags...} {test} {objects...} -o {exe}")
            .run()
            .with_context(|| format!("compiling {} for {for_archs}", test.display()))?;
        if run {
            cmd!(sh, "{exe}").run().with_context(|| {
                format!("{name} failed on {for_archs} (its output above says which case)")
            })?;
        }
    }
    Ok(())
}

/// Host-only tests of the overlay: plain C++ files, built with the machine's compiler and run.
fn overlay_unit_tests(sh: &Shell, project: &Project) -> Result<()> {
    let cxx =
        which::which("c++").context("a C++ compiler (c++) is needed: apt-get install -y g++")?;
    let overlay = project.overlay_dir();
    let scratch = project.scratch()?;
    let tests = [
        (
            "test-switches",
            vec![
                overlay.join("switches.cpp"),
                overlay.join("tests/test-switches.cpp"),
            ],
        ),
        (
            "test-reorder",
            vec![
                overlay.join("reorder.cpp"),
                overlay.join("tests/test-reorder.cpp"),
            ],
        ),
        (
            "test-graph-signature",
            vec![overlay.join("tests/test-graph-signature.cpp")],
        ),
    ];
    for (name, sources) in tests {
        let exe = scratch.path().join(name);
        cmd!(
            sh,
            "{cxx} -std=c++17 -Wall -Wextra -Werror -o {exe} {sources...}"
        )
        .run()
        .with_context(|| format!("compiling {name}"))?;
        cmd!(sh, "{exe}")
            .run()
            .with_context(|| format!("{name} failed"))?;
    }
    Ok(())
}

/// The CPU build must run models: a tiny llama written by the host's own test-llama-archs, and
/// small variants of the synth presets (their metadata and tensors as llama.cpp loads them); and
/// llama-server, built offline, must serve a small concurrent load (serve_small).
fn smoke_cpu(sh: &Shell, project: &Project, built: &build::Built) -> Result<()> {
    let bin = built.build_dir.join("bin");
    let (bench, archs, server) = (
        bin.join("llama-bench"),
        bin.join("test-llama-archs"),
        bin.join("llama-server"),
    );
    for tool in [&bench, &archs, &server] {
        if !tool.is_file() {
            bail!("the CPU build has no {}", tool.display());
        }
    }
    let scratch = project.scratch()?;
    let models = scratch.path();
    cmd!(sh, "{archs} -a ^llama$ -s 42 -o {models}")
        .quiet()
        .ignore_stderr()
        .run()
        .context("writing a tiny llama GGUF")?;
    let mut to_run = vec![models.join("llama-dense.gguf")];
    // The qwen36 variant with its MTP layer and F16 shared-expert gates: every tensor the writer
    // can emit must load.
    for (preset, layers, experts, mtp, tensor_type) in [
        (Preset::Qwen3_0_6b, 2, None, false, Vec::new()),
        (
            Preset::Qwen36_35bA3b,
            4,
            Some(8),
            true,
            vec![("ffn_gate_inp_shexp".to_owned(), Quant::F16)],
        ),
    ] {
        let out = models.join(format!("{preset:?}.gguf"));
        let args = SynthArgs {
            preset,
            out: Some(out.clone()),
            seed: 1,
            layers: Some(layers),
            experts,
            tensor_type,
            mtp,
            stable: false,
        };
        synth::run(sh, project, args)?;
        to_run.push(out);
    }
    for model in &to_run {
        // --repack 0: the CPU repack (AMX) path crashes on batched prompts on some machines.
        let table = cmd!(sh, "{bench} -m {model} -p 16 -n 8 -r 1 --repack 0 -o md")
            .ignore_stderr()
            .read()
            .with_context(|| format!("llama-bench on {}", model.display()))?;
        println!("{table}");
        if !table.contains("tg8") || !table.contains("pp16") {
            bail!(
                "llama-bench printed no pp16/tg8 rows for {}:\n{table}",
                model.display()
            );
        }
    }
    serve_small(&server, &to_run[0], &models.join("serve-check"))
}

/// llama-server on `model` under a small concurrent load (serve-check on the CPU build): every
/// request answered, hung up on or refused as planned, the server alive.
fn serve_small(server: &Path, model: &Path, logs: &Path) -> Result<()> {
    let load = Load {
        slots: 2,
        slot_ctx: 256,
        requests: 12,
        rounds: 2,
        clients: None,
    };
    let report = serve_check::check(server, model, &load, true, &[], logs, None, &[])?
        .context("serve-check ran every part, yet returned no report")?;
    println!("{}", serve_check::markdown(&report, "cpu", model));
    if !report.verdict.is_empty() {
        bail!("llama-server under load: {}", report.verdict.join("; "));
    }
    Ok(())
}

pub fn run(sh: &Shell, project: &Project, args: CiArgs) -> Result<()> {
    let cells = expand(&project.matrix()?);
    for filter in &args.cell {
        if !cells
            .iter()
            .any(|c| selected(c, std::slice::from_ref(filter)))
        {
            let names: Vec<&str> = cells.iter().map(|c| c.name.as_str()).collect();
            bail!(
                "no cell matches {filter:?}; cells are:\n  {}",
                names.join("\n  ")
            );
        }
    }
    let mut outcomes = Vec::new();
    for cell in cells.iter().filter(|c| selected(c, &args.cell)) {
        let (result, seconds) = match skip_reason(sh, project, cell) {
            Some(why) => (CellResult::Skipped(why), None),
            None if args.list => (CellResult::Runnable, None),
            None => {
                step(format!("cell {}", cell.name));
                let started = Instant::now();
                let result = match run_cell(sh, project, cell) {
                    Ok(()) => CellResult::Passed,
                    Err(err) => {
                        eprintln!("cell {} failed: {err:#}", cell.name);
                        CellResult::Failed(format!("{err:#}"))
                    }
                };
                (result, Some(started.elapsed().as_secs()))
            }
        };
        outcomes.push(Outcome {
            cell,
            result,
            seconds,
        });
    }

    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcomes)?);
    } else {
        println!();
        print!("{}", table(&outcomes));
    }
    let failed = outcomes
        .iter()
        .filter(|o| matches!(o.result, CellResult::Failed(_)))
        .count();
    if failed > 0 {
        bail!("{failed} cell(s) failed");
    }
    Ok(())
}

/// The results as a table: one row per cell, then the counts.
fn table(outcomes: &[Outcome]) -> String {
    use std::fmt::Write;
    let width = outcomes
        .iter()
        .map(|o| o.cell.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    // A time column only when something ran: --list and skipped cells have no time.
    let timed = outcomes.iter().any(|o| o.seconds.is_some());
    let time_column = |time: &str| {
        if timed {
            format!("  {time:>6}")
        } else {
            String::new()
        }
    };
    let mut out = String::new();
    let header = time_column("time");
    writeln!(out, "{:width$}  {:8}{header}  detail", "cell", "result").unwrap();
    for o in outcomes {
        let (status, detail) = match &o.result {
            CellResult::Passed => ("passed", String::new()),
            CellResult::Failed(why) => {
                ("FAILED", why.lines().next().unwrap_or_default().to_owned())
            }
            CellResult::Skipped(why) => ("skipped", why.clone()),
            CellResult::Runnable => ("runnable", String::new()),
        };
        let time = time_column(&o.seconds.map(|s| format!("{s}s")).unwrap_or_default());
        let row = format!("{:width$}  {status:8}{time}  {detail}", o.cell.name);
        writeln!(out, "{}", row.trim_end()).unwrap();
    }
    let count = |f: fn(&CellResult) -> bool| outcomes.iter().filter(|o| f(&o.result)).count();
    let passed = count(|r| matches!(r, CellResult::Passed));
    let failed = count(|r| matches!(r, CellResult::Failed(_)));
    let skipped = count(|r| matches!(r, CellResult::Skipped(_)));
    let runnable = count(|r| matches!(r, CellResult::Runnable));
    if runnable > 0 {
        writeln!(out, "{runnable} runnable here, {skipped} skipped").unwrap();
    } else {
        writeln!(
            out,
            "cells: {passed} passed, {failed} failed, {skipped} skipped"
        )
        .unwrap();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(text: &str) -> Matrix {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("matrix.toml");
        std::fs::write(&path, text).unwrap();
        Matrix::load(&path).unwrap()
    }

    #[test]
    fn expands_host_arch_flavor_kind() {
        let m = matrix(
            r#"
            checks = ["fmt", "test"]
            [[group]]
            host = "h"
            kind = "cpu"
            flavors = ["flashrt"]
            targets = ["llama-bench"]
            [[group]]
            host = "h"
            kind = "compile-only"
            archs = ["90a", "120a"]
            flavors = ["flashrt"]
            [[group]]
            host = "h"
            kind = "gpu"
            archs = ["90a"]
            flavors = ["stock", "flashrt"]
            "#,
        );
        let names: Vec<String> = expand(&m).into_iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "fmt",
                "test",
                "h/patch-check",
                "h/cpu/flashrt",
                "vendor/compile-only",
                "h/compile-only/sm_90a/flashrt",
                "h/compile-only/sm_120a/flashrt",
                "vendor/gpu/sm_90a",
                "h/gpu/sm_90a/stock",
                "h/gpu/sm_90a/flashrt",
            ]
        );
        let cells = expand(&m);
        let vendor = |archs: &[&str]| Action::VendorTests {
            archs: archs.iter().map(|a| a.to_string()).collect(),
        };
        assert_eq!(cells[4].action, vendor(&["90a", "120a"]));
        assert_eq!(cells[4].kind, CellKind::CompileOnly);
        assert_eq!(cells[7].action, vendor(&["90a"]));
        assert_eq!(cells[7].kind, CellKind::Gpu);
        assert_eq!(
            cells[3].action,
            Action::Build {
                host: "h".into(),
                flavor: Flavor::Flashrt,
                arch: None,
                targets: vec!["llama-bench".into()]
            }
        );
        assert!(selected(&cells[5], &["h/compile-only/".into()]));
        assert!(!selected(&cells[5], &["h/compile".into()]));
        assert!(selected(&cells[4], &["vendor/".into()]));
    }

    #[test]
    fn only_cells_that_ran_show_a_time() {
        let cell = |name: &str| Cell {
            name: name.into(),
            kind: CellKind::Cpu,
            action: Action::Check { check: Check::Fmt },
        };
        let (a, b) = (cell("fmt"), cell("test"));
        let listed = table(&[
            Outcome {
                cell: &a,
                result: CellResult::Runnable,
                seconds: None,
            },
            Outcome {
                cell: &b,
                result: CellResult::Skipped("no GPU".into()),
                seconds: None,
            },
        ]);
        assert!(
            !listed.contains("time") && !listed.contains("0s"),
            "{listed}"
        );
        assert!(listed.contains("1 runnable here, 1 skipped"), "{listed}");

        let ran = table(&[
            Outcome {
                cell: &a,
                result: CellResult::Passed,
                seconds: Some(7),
            },
            Outcome {
                cell: &b,
                result: CellResult::Skipped("no GPU".into()),
                seconds: None,
            },
        ]);
        let lines: Vec<&str> = ran.lines().collect();
        assert!(lines[0].contains("time"), "{ran}");
        assert!(
            lines[1].contains("passed") && lines[1].contains("7s"),
            "{ran}"
        );
        let is_time = |w: &str| {
            w.strip_suffix('s')
                .is_some_and(|n| n.parse::<u64>().is_ok())
        };
        assert!(lines[2].contains("skipped"), "{ran}");
        assert!(!lines[2].split_whitespace().any(is_time), "{ran}");
    }

    #[test]
    fn rejects_groups_without_archs_where_needed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("matrix.toml");
        std::fs::write(
            &path,
            "checks = []\n[[group]]\nhost = \"h\"\nkind = \"gpu\"\nflavors = [\"stock\"]\n",
        )
        .unwrap();
        let err = Matrix::load(&path).unwrap_err();
        assert!(
            format!("{err:#}").contains("archs must be given"),
            "{err:#}"
        );
    }
}
