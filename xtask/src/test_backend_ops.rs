//! `cargo xtask test-backend-ops`: llama.cpp's backend test against the CPU, on the build with the
//! overlay, with the repack cache off (the suite reuses buffers at the same addresses) and the
//! overlay's statistics on, so that a FlashRT case whose window never ran is caught.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use xshell::Shell;

use crate::build::{self, BuildArgs};
use crate::doctor;
use crate::project::{note, step, Project};

#[derive(Debug, Args, Clone)]
pub struct TestBackendOpsArgs {
    /// Which host (a folder under hosts/).
    #[arg(long, default_value = "llama.cpp")]
    pub host: String,
    /// Ops to test, comma-separated (test-backend-ops -o; regexes allowed).
    /// Default: every FlashRT case (FLASHRT_.*).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "OPS",
        conflicts_with = "full"
    )]
    pub ops: Vec<String>,
    /// The whole upstream suite plus every FlashRT case.
    #[arg(long)]
    pub full: bool,
    /// CUDA architecture to build for (default: the host's default).
    #[arg(long, value_name = "ARCH")]
    pub arch: Option<String>,
    /// Test the stock build (no overlay) instead.
    #[arg(long)]
    pub stock: bool,
    /// Without a GPU, build and stop with success instead of failing.
    #[arg(long)]
    pub allow_no_gpu: bool,
    /// Use this local checkout, extracted tree or archive (.tar.xz, .tar.gz, .tar; e.g. from
    /// `host pack`) as the host source; it must match the pin.
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub host_src: Option<PathBuf>,
    /// Parallel test workers (default: all cores).
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// The CUDA device to test against the CPU (test-backend-ops -b), e.g. CUDA1 on a second GPU.
    #[arg(long, default_value = "CUDA0", value_name = "NAME")]
    pub backend: String,
}

impl TestBackendOpsArgs {
    /// The FlashRT cases on `host`'s default architecture, as the command line would default.
    pub fn new(host: &str) -> TestBackendOpsArgs {
        TestBackendOpsArgs {
            host: host.to_owned(),
            ops: Vec::new(),
            full: false,
            arch: None,
            stock: false,
            allow_no_gpu: false,
            host_src: None,
            jobs: None,
            backend: "CUDA0".to_owned(),
        }
    }
}

pub fn run(sh: &Shell, project: &Project, args: TestBackendOpsArgs) -> Result<()> {
    let gpu = doctor::gpus(sh);
    if let Err(why) = &gpu {
        if !args.allow_no_gpu {
            bail!(
                "no NVIDIA GPU visible ({why}): test-backend-ops compares the CUDA backend with the CPU. \
                 Run it on a GPU machine, or pass --allow-no-gpu to only build."
            );
        }
    }
    let built = build::build(
        sh,
        project,
        &BuildArgs {
            arch: args.arch.iter().cloned().collect(),
            stock: args.stock,
            targets: vec!["test-backend-ops".into()],
            host_src: args.host_src.clone(),
            ..BuildArgs::new(&args.host)
        },
    )?;
    if gpu.is_err() {
        note("no GPU: built test-backend-ops, ran nothing (--allow-no-gpu)");
        return Ok(());
    }
    let binary = built.build_dir.join("bin/test-backend-ops");
    let filter = if args.full {
        None
    } else if args.ops.is_empty() {
        Some("FLASHRT_.*".to_owned())
    } else {
        Some(args.ops.join(","))
    };
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(2)
    });
    let log = built.build_dir.join("test-backend-ops.log");
    let windows = if args.stock {
        Vec::new()
    } else {
        window_names(project)?
    };
    let output = run_suite(
        &binary,
        &args.backend,
        filter.as_deref(),
        jobs,
        &windows,
        &log,
    )?;
    let summary = summarize(&output);
    for line in &summary.lines {
        println!("{line}");
    }
    println!("full log: {}", log.display());
    if !summary.passed {
        bail!("test-backend-ops failed (see {})", log.display());
    }
    // The FlashRT cases ran: each window must have run at least once.
    if !args.stock && (args.full || filter.as_deref() == Some("FLASHRT_.*")) {
        let idle: Vec<&String> = summary
            .window_hits
            .iter()
            .filter(|(_, hits)| *hits == 0)
            .map(|(name, _)| name)
            .collect();
        if summary.window_hits.is_empty() {
            bail!("the overlay printed no statistics: is this build compiled with GGML_CUDA_FLASHRT=ON?");
        }
        if !idle.is_empty() {
            bail!(
                "window(s) {:?} never ran: their cases passed on stock kernels only",
                idle
            );
        }
    }
    Ok(())
}

/// The window names of the overlay in this checkout (rows of overlay/registry.cu).
pub fn window_names(project: &Project) -> Result<Vec<String>> {
    let path = project.overlay_dir().join("registry.cu");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| l.contains("flashrt_tier::"))
        .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
        .collect())
}

fn run_suite(
    binary: &Path,
    backend: &str,
    filter: Option<&str>,
    jobs: usize,
    windows: &[String],
    log: &Path,
) -> Result<String> {
    let mut command = std::process::Command::new(binary);
    command.args(["test", "-b", backend, "-j", &jobs.to_string()]);
    if let Some(filter) = filter {
        command.args(["-o", filter]);
    }
    command
        .env("GGML_CUDA_FLASHRT_NO_CACHE", "1")
        .env("FRT_STATS", "1");
    // Every window is tested, whatever its tier.
    for name in windows {
        command.env(format!("FRT_{name}_SWAP"), "1");
    }
    step(format!(
        "{} test -b {backend} -j {jobs}{} (GGML_CUDA_FLASHRT_NO_CACHE=1 FRT_STATS=1, every window on)",
        binary.display(),
        filter.map(|f| format!(" -o {f}")).unwrap_or_default()
    ));
    let out = command
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    std::fs::write(log, &text).with_context(|| format!("writing {}", log.display()))?;
    if !out.status.success() && !text.contains("tests passed") {
        bail!(
            "{} exited with {}; see {}",
            binary.display(),
            out.status,
            log.display()
        );
    }
    Ok(text)
}

#[derive(Debug, PartialEq)]
struct Summary {
    passed: bool,
    /// The lines worth showing: failures, per-backend totals, the overlay's statistics.
    lines: Vec<String>,
    window_hits: Vec<(String, u64)>,
}

fn summarize(output: &str) -> Summary {
    let mut lines = Vec::new();
    let mut window_hits = Vec::new();
    let mut failed = false;
    let mut totals = 0;
    for line in output.lines() {
        let plain = strip_ansi(line);
        let trimmed = plain.trim();
        if trimmed.contains("FAIL") {
            failed = true;
            lines.push(trimmed.to_owned());
        } else if trimmed.contains("tests passed") || trimmed.contains("backends passed") {
            totals += 1;
            lines.push(trimmed.to_owned());
        } else if let Some(stats) = trimmed.strip_prefix("FlashRT stats:") {
            lines.push(trimmed.to_owned());
            let words: Vec<&str> = stats.split_whitespace().collect();
            if let [name, "hits", hits, "nodes", _, ..] = words.as_slice() {
                if let Ok(hits) = hits.parse() {
                    window_hits.push(((*name).to_owned(), hits));
                }
            }
        }
    }
    Summary {
        passed: !failed && totals > 0,
        lines,
        window_hits,
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSING: &str = "Testing 2 devices\n\nBackend 1/2: CUDA0\n  \
        FLASHRT_GDN_GATED_NORM(ne=[128,32,1,1]): \u{1b}[1;32mOK\u{1b}[0m\n  \
        15/15 tests passed\n  Backend CUDA0: \u{1b}[1;32mOK\u{1b}[0m\n2/2 backends passed\n\
        FlashRT stats: 15 graph evaluation(s), 90 compute nodes, 40 covered by windows (44.4%)\n\
        FlashRT stats:   GDN_GATED_NORM           hits       13  nodes       52  predicate     12.5 us  run     30.1 us a graph evaluation\n\
        FlashRT stats:   OTHER_WINDOW             hits        0  nodes        0\n";

    #[test]
    fn programmatic_defaults_equal_the_command_line_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: TestBackendOpsArgs,
        }
        let parsed = Wrap::parse_from(["test-backend-ops"]).args;
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", TestBackendOpsArgs::new("llama.cpp"))
        );
    }

    #[test]
    fn window_names_come_from_the_registry() {
        let project = Project {
            root: Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .to_path_buf(),
        };
        let names = window_names(&project).unwrap();
        assert!(
            names.contains(&"GDN_GATED_NORM".to_owned())
                && names.contains(&"SHEXP_GATE".to_owned()),
            "{names:?}"
        );
    }

    #[test]
    fn reads_totals_failures_and_window_hits() {
        let s = summarize(PASSING);
        assert!(s.passed);
        assert_eq!(
            s.window_hits,
            [
                ("GDN_GATED_NORM".to_owned(), 13),
                ("OTHER_WINDOW".to_owned(), 0)
            ]
        );
        assert!(s.lines.iter().any(|l| l == "15/15 tests passed"));

        let failing = PASSING.replace(
            "FLASHRT_GDN_GATED_NORM(ne=[128,32,1,1]): \u{1b}[1;32mOK",
            "FLASHRT_GDN_GATED_NORM(ne=[128,32,1,1]): [MUL] NMSE = 1.0 > 1e-07 \u{1b}[1;31mFAIL",
        );
        let s = summarize(&failing);
        assert!(!s.passed);
        assert!(s.lines.iter().any(|l| l.contains("NMSE = 1.0")));

        // No totals at all (crashed early) is not a pass.
        assert!(!summarize("Testing 2 devices\n").passed);
    }
}
