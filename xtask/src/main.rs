//! cargo xtask: the FlashRT-llama.cpp driver.
//!
//! It pins a host (llama.cpp), applies the patch series, mounts the overlay, builds through CMake
//! and runs the CI matrix, the same way on a laptop, a GPU box and in CI.

mod bench;
mod build;
mod ci;
mod config;
mod coverage;
mod doctor;
mod fa4_aot;
mod fsutil;
mod gguf;
mod host;
mod parity;
mod patch;
mod profile;
mod project;
mod serve_check;
mod server;
mod synth;
mod test_backend_ops;
mod toolchain;
mod treehash;

#[cfg(test)]
mod tests;

use anyhow::Result;
use clap::{Parser, Subcommand};
use xshell::Shell;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "FlashRT-llama.cpp: build llama.cpp with the FlashRT overlay, reproducibly",
    long_about = "FlashRT-llama.cpp: build llama.cpp with the FlashRT overlay, reproducibly.\n\n\
        The main job is `cargo xtask build`: it fetches the pinned llama.cpp (verified by tree hash), \
        applies patches/llama.cpp, mounts overlay/ at ggml/src/ggml-cuda/flashrt, and builds with CMake \
        and Ninja. Work files live in .xtask/ (git-ignored).",
    after_help = "Examples:\n  cargo xtask build                    # CUDA build for sm_90a with the overlay\n  \
        cargo xtask build --arch 90a,120a    # several architectures\n  \
        cargo xtask build --stock            # the same pinned tree, no overlay\n  \
        cargo xtask build --stock --arch 86  # other architectures: without the overlay\n  \
        cargo xtask build --cpu              # no CUDA\n  \
        cargo xtask ci --list                # what CI runs and what this machine can run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fetch and inspect the pinned host source.
    Host(host::HostArgs),
    /// Apply, check or export the patch series.
    Patch(patch::PatchArgs),
    /// Fetch, patch, mount and build the host.
    Build(build::BuildArgs),
    /// Show which tools, GPUs and host sources this machine has, and how to fix what is missing.
    Doctor,
    /// Run llama.cpp's test-backend-ops (CUDA vs CPU) on the overlay build; default: the FlashRT cases.
    TestBackendOps(test_backend_ops::TestBackendOpsArgs),
    /// Write a random-weight GGUF at a real model's shape (Q4_K_M-like, seeded, streamed).
    Synth(synth::SynthArgs),
    /// Stock vs overlay in one binary on one GGUF (A/B/A), with ratio and share of the bandwidth floor.
    Bench(bench::BenchArgs),
    /// Is the overlay quality-neutral? Overlay-vs-stock divergence against fusion-off-vs-stock.
    Parity(parity::ParityArgs),
    /// Where decode time goes: a CUPTI kernel trace per step, stock vs overlay, per kernel family.
    Profile(profile::ProfileArgs),
    /// llama-server under concurrent load, stock vs overlay: nothing lost, answers compared.
    ServeCheck(serve_check::ServeCheckArgs),
    /// FlashAttention-4 kernels compiled ahead of time: generate (CPU, Python) or --check the committed objects.
    Fa4Aot(fa4_aot::Fa4AotArgs),
    /// Summarise a GGML_FLASHRT_DUMP file: window coverage and the ops no window covers.
    Coverage(coverage::CoverageArgs),
    /// Run the CI matrix cells this machine can run.
    Ci(ci::CiArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // The whole chain of causes on one report, without a backtrace: errors here are
            // about the user's machine or inputs, and each says what to do.
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let sh = Shell::new()?;
    let project = project::Project::discover()?;
    match cli.command {
        Command::Host(args) => host::run(&sh, &project, args),
        Command::Patch(args) => patch::run(&sh, &project, args),
        Command::Build(args) => build::run(&sh, &project, args),
        Command::Doctor => doctor::run(&sh, &project),
        Command::TestBackendOps(args) => test_backend_ops::run(&sh, &project, args),
        Command::Synth(args) => synth::run(&sh, &project, args),
        Command::Bench(args) => bench::run(&sh, &project, args),
        Command::Parity(args) => parity::run(&sh, &project, args),
        Command::Profile(args) => profile::run(&sh, &project, args),
        Command::ServeCheck(args) => serve_check::run(&sh, &project, args),
        Command::Fa4Aot(args) => fa4_aot::run(&sh, &project, args),
        Command::Coverage(args) => coverage::run(args),
        Command::Ci(args) => ci::run(&sh, &project, args),
    }
}
