//! `cargo xtask parity`: is the overlay quality-neutral? The same text is fed through the model
//! (teacher forcing, llama-perplexity) by stock kernels and by the overlay, and the overlay's
//! divergence from stock is compared with stock's own divergence when upstream's fusions are
//! turned off (GGML_CUDA_DISABLE_FUSION=1): fusion changes numerics too, so that pair is the
//! yardstick. Divergence is measured as llama-perplexity does (KL divergence of the token
//! distributions, top-1 agreement, RMS of the probability change).

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;
use xshell::Shell;

use crate::bench::{run_tool, GpuModelArgs, Prepared};
use crate::project::{step, Project};

#[derive(Debug, Args)]
pub struct ParityArgs {
    #[command(flatten)]
    pub target: GpuModelArgs,
    /// Tokens per chunk (the context; the second half of each chunk is scored).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(256..))]
    pub tokens: u32,
    /// Chunks of text to feed.
    #[arg(long, default_value_t = 4)]
    pub chunks: u32,
}

/// What llama-perplexity --kl-divergence reports, as used here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Divergence {
    pub mean_kld: f64,
    pub max_kld: f64,
    /// Percent of positions whose most likely token is the same.
    pub same_top_p: f64,
    /// Percent.
    pub rms_dp: f64,
}

/// Reads the statistics block of `llama-perplexity --kl-divergence`.
pub fn parse_divergence(output: &str) -> Result<Divergence> {
    let value = |prefix: &str| -> Result<f64> {
        let line = output
            .lines()
            .map(str::trim_start)
            .find(|l| l.starts_with(prefix))
            .with_context(|| format!("llama-perplexity printed no {prefix:?} line"))?;
        let text = line[prefix.len()..]
            .trim_start_matches([':', ' '])
            .split_whitespace()
            .next()
            .unwrap_or("");
        let v: f64 = text
            .trim_end_matches('%')
            .parse()
            .with_context(|| format!("{prefix}: {text:?}"))?;
        if !v.is_finite() {
            bail!("{prefix} is {v}: the model produced NaN or Inf");
        }
        Ok(v)
    };
    Ok(Divergence {
        mean_kld: value("Mean    KLD")?,
        max_kld: value("Maximum KLD")?,
        same_top_p: value("Same top p")?,
        rms_dp: value("RMS Δp")?,
    })
}

/// The overlay passes when it diverges from stock no more than stock diverges from itself with
/// fusion off: mean KL divergence at most 1.5× (plus 1e-6 for the all-zero case) and top-1
/// agreement at most 0.5 percentage points lower.
pub fn within_reference(overlay: &Divergence, reference: &Divergence) -> Result<()> {
    let kld_limit = reference.mean_kld * 1.5 + 1e-6;
    if overlay.mean_kld > kld_limit {
        bail!(
            "mean KL divergence {:.3e} exceeds the reference's {:.3e} (limit {kld_limit:.3e})",
            overlay.mean_kld,
            reference.mean_kld
        );
    }
    let top_limit = reference.same_top_p - 0.5;
    if overlay.same_top_p < top_limit {
        bail!(
            "top-1 agreement {:.3}% is below the reference's {:.3}% (limit {top_limit:.3}%)",
            overlay.same_top_p,
            reference.same_top_p
        );
    }
    Ok(())
}

fn perplexity(bin: &Path, args: &[String], env: &[(&str, &str)]) -> Result<String> {
    let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    let (stdout, stderr) = run_tool(bin, &args, env.iter().copied())?;
    Ok(stdout + &stderr)
}

pub fn run(sh: &Shell, project: &Project, args: ParityArgs) -> Result<()> {
    let Prepared {
        tool: bin, model, ..
    } = args
        .target
        .prepare(sh, project, "parity", "llama-perplexity")?;
    // A fixed text: the pinned tree's README (long enough for several 512-token chunks).
    let text = project.pristine_dir("llama.cpp").join("README.md");
    let scratch = project.scratch()?;
    let base = scratch.path().join("stock.kld");
    let common: Vec<String> = [
        "-m".to_owned(),
        model.display().to_string(),
        "-f".into(),
        text.display().to_string(),
        "-c".into(),
        args.tokens.to_string(),
        "--chunks".into(),
        args.chunks.to_string(),
        "-ngl".into(),
        "99".into(),
        "-fa".into(),
        "on".into(),
        "--kl-divergence-base".into(),
        base.display().to_string(),
    ]
    .into();
    let compare: Vec<String> = common
        .iter()
        .cloned()
        .chain(["--kl-divergence".to_owned()])
        .collect();

    step("stock (GGML_CUDA_FLASHRT_DISABLE=1): the reference logits");
    perplexity(&bin, &common, &[("GGML_CUDA_FLASHRT_DISABLE", "1")])?;
    step("overlay against stock");
    let overlay = parse_divergence(&perplexity(&bin, &compare, &[])?)?;
    step("stock with upstream fusion off against stock: the yardstick");
    let reference = parse_divergence(&perplexity(
        &bin,
        &compare,
        &[
            ("GGML_CUDA_FLASHRT_DISABLE", "1"),
            ("GGML_CUDA_DISABLE_FUSION", "1"),
        ],
    )?)?;

    println!(
        "\n{} · {} chunks of {} tokens\n",
        model.display(),
        args.chunks,
        args.tokens
    );
    println!("| pair | mean KLD | max KLD | same top-1 | RMS Δp |\n|---|---:|---:|---:|---:|");
    for (name, d) in [
        ("overlay vs stock", &overlay),
        ("fusion off vs stock (reference)", &reference),
    ] {
        println!(
            "| {name} | {:.3e} | {:.3e} | {:.3}% | {:.3}% |",
            d.mean_kld, d.max_kld, d.same_top_p, d.rms_dp
        );
    }
    within_reference(&overlay, &reference).context("the overlay is not quality-neutral")?;
    println!("\nparity: the overlay diverges from stock no more than upstream fusion does");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // As llama-perplexity prints it (identical runs give -0.000000 and -nan uncertainties).
    const OUTPUT: &str = "Mean ln(PPL(Q)/PPL(base))     :   0.000001 ±       -nan\n\
        ====== KL divergence statistics ======\n\
        Mean    KLD:   0.000123 ±   0.000010\n\
        Maximum KLD:   0.004500\n\
        99.9%   KLD:   0.001000\n\
        ====== Token probability statistics ======\n\
        RMS Δp    :  0.120 ± 0.010 %\n\
        Same top p: 99.250 ± 0.120 %\n";

    #[test]
    fn reads_the_statistics_block() {
        let d = parse_divergence(OUTPUT).unwrap();
        assert_eq!(
            d,
            Divergence {
                mean_kld: 0.000123,
                max_kld: 0.0045,
                same_top_p: 99.25,
                rms_dp: 0.12
            }
        );
        let nan = OUTPUT.replace("Mean    KLD:   0.000123", "Mean    KLD:        nan");
        assert!(format!("{:#}", parse_divergence(&nan).unwrap_err()).contains("NaN"));
        assert!(parse_divergence("Final estimate: PPL = 12.3\n").is_err());
    }

    #[test]
    fn the_reference_pair_sets_the_limits() {
        let reference = Divergence {
            mean_kld: 1e-4,
            max_kld: 1e-2,
            same_top_p: 99.0,
            rms_dp: 0.1,
        };
        let same = Divergence {
            mean_kld: 1.2e-4,
            same_top_p: 98.7,
            ..reference
        };
        within_reference(&same, &reference).unwrap();
        let worse_kld = Divergence {
            mean_kld: 2e-4,
            ..reference
        };
        assert!(within_reference(&worse_kld, &reference).is_err());
        let worse_top = Divergence {
            same_top_p: 98.0,
            ..reference
        };
        assert!(within_reference(&worse_top, &reference).is_err());
        // Identical stock runs (KLD 0): the overlay may add rounding noise only.
        let zero = Divergence {
            mean_kld: 0.0,
            max_kld: 0.0,
            same_top_p: 100.0,
            rms_dp: 0.0,
        };
        within_reference(
            &Divergence {
                mean_kld: 5e-7,
                ..zero
            },
            &zero,
        )
        .unwrap();
        assert!(within_reference(
            &Divergence {
                mean_kld: 1e-5,
                ..zero
            },
            &zero
        )
        .is_err());
    }
}
