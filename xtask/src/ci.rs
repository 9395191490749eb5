//! `cargo xtask ci`: expands ci/matrix.toml into cells (host × arch × flavor × kind, plus the
//! driver's own checks), runs those this machine can run and says why the others are skipped.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::build::{self, BuildArgs};
use crate::config::{CellKind, Check, Flavor, Matrix};
use crate::doctor;
use crate::patch;
use crate::project::{step, Project};
use crate::synth::{self, Preset, Quant, SynthArgs};
use crate::test_backend_ops::{self, TestBackendOpsArgs};
use crate::toolchain::{self, CudaChoice, Provision};

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
}

#[derive(Debug, Serialize)]
struct Outcome<'a> {
    #[serde(flatten)]
    cell: &'a Cell,
    result: CellResult,
    seconds: u64,
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

/// All cells of the matrix, in run order: checks, then per group its cells.
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
        (CellKind::Gpu, Action::Build { arch, .. }) => {
            let arch = arch.as_deref().unwrap_or_default();
            match doctor::gpus(sh) {
                Err(why) => Some(format!("no NVIDIA GPU visible ({why})")),
                Ok(gpus) => {
                    let numbers: Vec<String> =
                        gpus.iter().map(|(_, cc)| cc.replace('.', "")).collect();
                    let arch_number: String =
                        arch.chars().take_while(char::is_ascii_digit).collect();
                    (!numbers.contains(&arch_number)).then(|| {
                        format!(
                            "needs an sm_{arch} GPU; this machine has sm_{}",
                            numbers.join(", sm_")
                        )
                    })
                }
            }
        }
        (CellKind::Gpu, _) => Some("gpu cells are builds".to_owned()),
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
    }
}

/// Host-only tests of the overlay: plain C++ files, built with the machine's compiler and run.
fn overlay_unit_tests(sh: &Shell, project: &Project) -> Result<()> {
    let cxx =
        which::which("c++").context("a C++ compiler (c++) is needed: apt-get install -y g++")?;
    let overlay = project.overlay_dir();
    let scratch = project.scratch()?;
    let tests = [(
        "test-switches",
        vec![
            overlay.join("switches.cpp"),
            overlay.join("tests/test-switches.cpp"),
        ],
    )];
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
/// small variants of the synth presets (their metadata and tensors as llama.cpp loads them).
fn smoke_cpu(sh: &Shell, project: &Project, built: &build::Built) -> Result<()> {
    let bin = built.build_dir.join("bin");
    let (bench, archs) = (bin.join("llama-bench"), bin.join("test-llama-archs"));
    for tool in [&bench, &archs] {
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
        let started = Instant::now();
        let result = match skip_reason(sh, project, cell) {
            Some(why) => CellResult::Skipped(why),
            None if args.list => CellResult::Runnable,
            None => {
                step(format!("cell {}", cell.name));
                match run_cell(sh, project, cell) {
                    Ok(()) => CellResult::Passed,
                    Err(err) => {
                        eprintln!("cell {} failed: {err:#}", cell.name);
                        CellResult::Failed(format!("{err:#}"))
                    }
                }
            }
        };
        outcomes.push(Outcome {
            cell,
            result,
            seconds: started.elapsed().as_secs(),
        });
    }

    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcomes)?);
    } else {
        print_table(&outcomes);
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

fn print_table(outcomes: &[Outcome]) {
    let width = outcomes
        .iter()
        .map(|o| o.cell.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!();
    println!("{:width$}  {:8}  {:>6}  detail", "cell", "result", "time");
    for o in outcomes {
        let (status, detail) = match &o.result {
            CellResult::Passed => ("passed", String::new()),
            CellResult::Failed(why) => {
                ("FAILED", why.lines().next().unwrap_or_default().to_owned())
            }
            CellResult::Skipped(why) => ("skipped", why.clone()),
            CellResult::Runnable => ("runnable", String::new()),
        };
        println!(
            "{:width$}  {status:8}  {:>5}s  {detail}",
            o.cell.name, o.seconds
        );
    }
    let count = |f: fn(&CellResult) -> bool| outcomes.iter().filter(|o| f(&o.result)).count();
    let passed = count(|r| matches!(r, CellResult::Passed));
    let failed = count(|r| matches!(r, CellResult::Failed(_)));
    let skipped = count(|r| matches!(r, CellResult::Skipped(_)));
    let runnable = count(|r| matches!(r, CellResult::Runnable));
    if runnable > 0 {
        println!("{runnable} runnable here, {skipped} skipped");
    } else {
        println!("cells: {passed} passed, {failed} failed, {skipped} skipped");
    }
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
                "h/compile-only/sm_90a/flashrt",
                "h/compile-only/sm_120a/flashrt",
                "h/gpu/sm_90a/stock",
                "h/gpu/sm_90a/flashrt",
            ]
        );
        let cells = expand(&m);
        assert_eq!(
            cells[3].action,
            Action::Build {
                host: "h".into(),
                flavor: Flavor::Flashrt,
                arch: None,
                targets: vec!["llama-bench".into()]
            }
        );
        assert!(selected(&cells[4], &["h/compile-only/".into()]));
        assert!(!selected(&cells[4], &["h/compile".into()]));
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
