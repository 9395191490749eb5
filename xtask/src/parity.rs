//! `cargo xtask parity`: is the overlay quality-neutral? The same token sequence is fed through
//! the model one token per decode step (teacher forcing) by `flashrt-logits` (bench/tools/
//! logits.cpp, compiled here against the build under test) in three processes, since the switches
//! are read once per process: stock (GGML_CUDA_FLASHRT_DISABLE=1), the overlay (default), and
//! stock with upstream's fusions off (GGML_CUDA_DISABLE_FUSION=1). Fusion changes numerics too, so
//! that reference pair is the yardstick: the overlay may diverge from stock (NMSE of the float32
//! logits, top-1 agreement) about as much as stock diverges from itself, and never produce NaN/Inf.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use xshell::{cmd, Shell};

use crate::bench::{self, run_tool, GpuModelArgs};
use crate::project::{note, step, write_atomic, Project};

#[derive(Debug, Args)]
#[command(after_help = "\
Three processes of <build>/bin/flashrt-logits (bench/tools/logits.cpp, compiled against the \
build) feed the same tokens one llama_decode per token (after the first --prompt tokens in one \
llama_decode, a prefill), flash attention on, and write every \
position's float32 logits: stock (GGML_CUDA_FLASHRT_DISABLE=1), overlay (default), and the \
reference, stock with upstream fusion off (GGML_CUDA_DISABLE_FUSION=1). Per position, overlay vs \
stock and reference vs stock: max |a-b|, NMSE = sum (a-b)^2 / sum b^2 (b: stock), same top-1 \
token.

Passes when the overlay's mean NMSE is at most 1.5x the reference's + 1e-12 and its top-1 \
agreement is below the reference's by at most two binomial standard deviations of it, \
2*sqrt(n*p*(1-p)) with p the reference's agreement (at least one position): on a model whose \
reference agrees everywhere that is one position; on a chaotic one (random weights amplify \
rounding through MoE routing) the agreement itself is a coin toss and the limit says so. NaN/Inf in any run, or runs that saw \
different tokens, fail.

Per-window switches in the environment (GGML_FLASHRT_NO_<NAME>, FRT_<NAME>_SWAP) reach the \
overlay run, so `FRT_SHEXP_GATE_SWAP=1 cargo xtask parity` checks a full-tier window; \
GGML_CUDA_FLASHRT_DISABLE and GGML_CUDA_DISABLE_FUSION are set for each run.")]
pub struct ParityArgs {
    #[command(flatten)]
    pub target: GpuModelArgs,
    /// Tokens to feed, one decode step each: the start of the pinned llama.cpp's README.md
    /// (about 2,400 tokens with the Qwen tokenizer). At least 256.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(256..))]
    pub tokens: u32,
    /// Feed the first N tokens in one llama_decode (a prefill of N, every position's logits
    /// compared), the rest one decode step each: the path of the windows that take prompts
    /// (PREFILL_FA4 from 32 tokens). Default 0: every token its own step.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub prompt: u32,
    /// Per-position table (TSV). Default: bench/results/<date>-<commit>-<gpu>-parity.tsv.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// One process of `flashrt-logits` and the switches it runs with. Every switch is set explicitly
/// (0 or 1), so that one inherited from the caller's environment cannot blur the pairs.
struct Setting {
    name: &'static str,
    what: &'static str,
    env: [(&'static str, &'static str); 2],
}

const STOCK: Setting = Setting {
    name: "stock",
    what: "stock kernels (GGML_CUDA_FLASHRT_DISABLE=1)",
    env: [
        ("GGML_CUDA_FLASHRT_DISABLE", "1"),
        ("GGML_CUDA_DISABLE_FUSION", "0"),
    ],
};
const OVERLAY: Setting = Setting {
    name: "overlay",
    what: "the overlay (its default switches)",
    env: [
        ("GGML_CUDA_FLASHRT_DISABLE", "0"),
        ("GGML_CUDA_DISABLE_FUSION", "0"),
    ],
};
const REFERENCE: Setting = Setting {
    name: "reference",
    what: "stock with upstream fusion off (GGML_CUDA_DISABLE_FUSION=1): the yardstick",
    env: [
        ("GGML_CUDA_FLASHRT_DISABLE", "1"),
        ("GGML_CUDA_DISABLE_FUSION", "1"),
    ],
};

const MAGIC: &[u8; 9] = b"FRTLOGITS";
const VERSION: i32 = 1;
const HEADER_BYTES: usize = MAGIC.len() + 3 * 4;

/// A `flashrt-logits` output file, read one position at a time (a whole file is
/// n_tokens × n_vocab × 4 bytes: 254 MB for 256 tokens of a 248k vocabulary).
pub struct LogitsReader {
    path: PathBuf,
    pub n_vocab: usize,
    pub tokens: Vec<i32>,
    reader: BufReader<File>,
    bytes: Vec<u8>,
}

impl LogitsReader {
    pub fn open(path: &Path) -> Result<LogitsReader> {
        let shown = path.display();
        let file = File::open(path).with_context(|| format!("opening {shown}"))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading the size of {shown}"))?
            .len();
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut header = [0u8; HEADER_BYTES];
        reader
            .read_exact(&mut header)
            .with_context(|| format!("{shown}: shorter than a flashrt-logits header"))?;
        if &header[..MAGIC.len()] != MAGIC {
            bail!("{shown}: not a flashrt-logits file (no FRTLOGITS magic)");
        }
        let field = |i: usize| {
            let at = MAGIC.len() + 4 * i;
            i32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let (version, n_vocab, n_tokens) = (field(0), field(1), field(2));
        if version != VERSION {
            bail!("{shown}: flashrt-logits format version {version}, this xtask reads {VERSION}");
        }
        if n_vocab <= 0 || n_tokens <= 0 {
            bail!("{shown}: {n_tokens} positions × {n_vocab} logits");
        }
        let (n_vocab, n_tokens) = (n_vocab as usize, n_tokens as usize);
        let expected = (HEADER_BYTES + 4 * n_tokens + 4 * n_tokens * n_vocab) as u64;
        if len != expected {
            bail!(
                "{shown}: {len} bytes, but {n_tokens} positions × {n_vocab} logits take {expected} \
                 (a run cut short?)"
            );
        }
        let mut ids = vec![0u8; 4 * n_tokens];
        reader
            .read_exact(&mut ids)
            .with_context(|| format!("{shown}: reading the token ids"))?;
        let tokens = ids
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(LogitsReader {
            path: path.to_owned(),
            n_vocab,
            tokens,
            reader,
            bytes: vec![0; 4 * n_vocab],
        })
    }

    /// Reads the next position's logits into `row`.
    pub fn next_row(&mut self, row: &mut Vec<f32>) -> Result<()> {
        self.reader
            .read_exact(&mut self.bytes)
            .with_context(|| format!("reading {}", self.path.display()))?;
        row.clear();
        row.extend(
            self.bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    }
}

/// How one position's logits differ from stock's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionDiff {
    pub max_abs: f64,
    /// Σ(a-b)² / Σb², b being stock.
    pub nmse: f64,
    /// The most likely next token is the same.
    pub top1_same: bool,
}

/// Compares one position's logits `test` with stock's `base` (same length, all finite).
pub fn position_diff(test: &[f32], base: &[f32]) -> PositionDiff {
    let mut max_abs = 0.0f64;
    let mut err = 0.0f64;
    let mut norm = 0.0f64;
    for (&a, &b) in test.iter().zip(base) {
        let d = f64::from(a) - f64::from(b);
        max_abs = max_abs.max(d.abs());
        err += d * d;
        norm += f64::from(b) * f64::from(b);
    }
    let nmse = if err == 0.0 {
        0.0
    } else if norm == 0.0 {
        f64::INFINITY
    } else {
        err / norm
    };
    PositionDiff {
        max_abs,
        nmse,
        top1_same: argmax(test) == argmax(base),
    }
}

/// The first index of the largest value.
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// One pair (a run against stock) over all positions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairStats {
    pub positions: usize,
    pub max_abs: f64,
    pub nmse_sum: f64,
    pub nmse_max: f64,
    /// Positions whose top-1 token is the same as stock's.
    pub top1_same: usize,
}

impl PairStats {
    fn add(&mut self, d: &PositionDiff) {
        self.positions += 1;
        self.max_abs = self.max_abs.max(d.max_abs);
        self.nmse_sum += d.nmse;
        self.nmse_max = self.nmse_max.max(d.nmse);
        self.top1_same += usize::from(d.top1_same);
    }

    pub fn mean_nmse(&self) -> f64 {
        self.nmse_sum / self.positions.max(1) as f64
    }

    pub fn top1_percent(&self) -> f64 {
        100.0 * self.top1_same as f64 / self.positions.max(1) as f64
    }
}

/// One row of the per-position table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionRow {
    pub pos: usize,
    pub token: i32,
    pub overlay: PositionDiff,
    pub reference: PositionDiff,
}

#[derive(Debug)]
pub struct Comparison {
    pub overlay: PairStats,
    pub reference: PairStats,
    pub rows: Vec<PositionRow>,
}

/// Streams the three runs' files position by position: the overlay and the reference each against
/// stock. The files must hold the same tokens and shape, and every logit must be finite.
pub fn compare_runs(stock: &Path, overlay: &Path, reference: &Path) -> Result<Comparison> {
    let mut files = Vec::new();
    for (name, path) in [
        (STOCK.name, stock),
        (OVERLAY.name, overlay),
        (REFERENCE.name, reference),
    ] {
        let file = LogitsReader::open(path).with_context(|| format!("the {name} run's logits"))?;
        files.push((name, file));
    }
    let (_, base) = &files[0];
    for (name, file) in &files[1..] {
        if file.n_vocab != base.n_vocab || file.tokens.len() != base.tokens.len() {
            bail!(
                "the {name} run has {} positions × {} logits, stock {} × {}",
                file.tokens.len(),
                file.n_vocab,
                base.tokens.len(),
                base.n_vocab
            );
        }
        if let Some(pos) = (0..base.tokens.len()).find(|&p| file.tokens[p] != base.tokens[p]) {
            bail!(
                "the {name} run was fed other tokens than stock: position {pos} has token {}, stock {}",
                file.tokens[pos],
                base.tokens[pos]
            );
        }
    }
    let tokens = base.tokens.clone();
    let mut rows_of_logits = vec![Vec::new(); files.len()];
    let mut comparison = Comparison {
        overlay: PairStats::default(),
        reference: PairStats::default(),
        rows: Vec::with_capacity(tokens.len()),
    };
    for (pos, &token) in tokens.iter().enumerate() {
        for ((name, file), row) in files.iter_mut().zip(&mut rows_of_logits) {
            file.next_row(row)?;
            if let Some(i) = row.iter().position(|v| !v.is_finite()) {
                bail!(
                    "the {name} run produced {} at position {pos} (token {token}), logit {i}",
                    row[i]
                );
            }
        }
        let overlay = position_diff(&rows_of_logits[1], &rows_of_logits[0]);
        let reference = position_diff(&rows_of_logits[2], &rows_of_logits[0]);
        comparison.overlay.add(&overlay);
        comparison.reference.add(&reference);
        comparison.rows.push(PositionRow {
            pos,
            token,
            overlay,
            reference,
        });
    }
    Ok(comparison)
}

/// How much more mean NMSE than the reference pair the overlay may have. Both pairs are float
/// reassociation noise of the same order (fused kernels sum in another order than unfused ones),
/// so the overlay is held to the reference's magnitude, not below it.
const NMSE_FACTOR: f64 = 1.5;
/// Absolute slack, for a reference pair that happens to be bit-identical (NMSE 0).
const NMSE_FLOOR: f64 = 1e-12;

/// How many positions of top-1 agreement the overlay may trail the reference by: two binomial
/// standard deviations of the reference's agreement, at least one. Where the reference agrees
/// everywhere (a well-conditioned model) that is one position; where rounding alone flips half
/// the choices (random weights) the count itself is that noisy.
pub fn top1_allowance(reference: &PairStats) -> usize {
    let n = reference.positions as f64;
    let p = reference.top1_same as f64 / n.max(1.0);
    ((2.0 * (n * p * (1.0 - p)).sqrt()).ceil() as usize).max(1)
}

/// The pass rule: the overlay's mean NMSE at most 1.5× the reference's (+1e-12), and its top-1
/// agreement with stock at most [`top1_allowance`] positions below the reference's.
pub fn within_reference(overlay: &PairStats, reference: &PairStats) -> Result<()> {
    let nmse_limit = NMSE_FACTOR * reference.mean_nmse() + NMSE_FLOOR;
    if overlay.mean_nmse() > nmse_limit {
        bail!(
            "mean NMSE {:.3e} exceeds {NMSE_FACTOR}× the reference's {:.3e} + {NMSE_FLOOR:e} \
             (limit {nmse_limit:.3e})",
            overlay.mean_nmse(),
            reference.mean_nmse()
        );
    }
    let allowance = top1_allowance(reference);
    let top1_limit = reference.top1_same.saturating_sub(allowance);
    if overlay.top1_same < top1_limit {
        bail!(
            "top-1 agreement {}/{} is below the reference's {}/{} minus {allowance} position(s)",
            overlay.top1_same,
            overlay.positions,
            reference.top1_same,
            reference.positions
        );
    }
    Ok(())
}

/// The per-position table, tab-separated with a header line.
pub fn tsv(rows: &[PositionRow]) -> String {
    let mut out = String::from(
        "pos\ttoken\toverlay_max_abs\toverlay_nmse\toverlay_top1_same\t\
         reference_max_abs\treference_nmse\treference_top1_same\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{}\t{}\t{:.6e}\t{:.6e}\t{}\t{:.6e}\t{:.6e}\t{}\n",
            r.pos,
            r.token,
            r.overlay.max_abs,
            r.overlay.nmse,
            u8::from(r.overlay.top1_same),
            r.reference.max_abs,
            r.reference.nmse,
            u8::from(r.reference.top1_same)
        ));
    }
    out
}

pub fn table(comparison: &Comparison) -> String {
    let mut out = String::from(
        "| pair | max abs diff | NMSE at position 0 | mean NMSE | max NMSE | top-1 agreement |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    // Position 0 has no history: its divergence comes from the layers alone, before recurrent
    // state and the KV cache carry differences forward.
    let first = comparison.rows.first();
    for (name, p, nmse0) in [
        (
            "overlay vs stock",
            &comparison.overlay,
            first.map(|r| r.overlay.nmse),
        ),
        (
            "fusion off vs stock (reference)",
            &comparison.reference,
            first.map(|r| r.reference.nmse),
        ),
    ] {
        out.push_str(&format!(
            "| {name} | {:.3e} | {:.3e} | {:.3e} | {:.3e} | {}/{} ({:.2}%) |\n",
            p.max_abs,
            nmse0.unwrap_or(f64::NAN),
            p.mean_nmse(),
            p.nmse_max,
            p.top1_same,
            p.positions,
            p.top1_percent()
        ));
    }
    out
}

/// `KEY:TYPE=VALUE` from a CMakeCache.txt.
fn cmake_cache_value(cache: &str, key: &str) -> Option<String> {
    cache.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name != key {
            return None;
        }
        rest.split_once('=').map(|(_, v)| v.to_owned())
    })
}

/// True when `output` is missing or older than any of `inputs`.
pub fn is_stale(output: &Path, inputs: &[&Path]) -> Result<bool> {
    let modified = |path: &Path| {
        path.metadata()
            .and_then(|m| m.modified())
            .with_context(|| format!("reading the modification time of {}", path.display()))
    };
    if !output.exists() {
        return Ok(true);
    }
    let built = modified(output)?;
    for input in inputs {
        if modified(input)? > built {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The C++ compiler a CMake build was configured with, and the build's CMakeCache.txt.
pub fn cmake_cxx_compiler(build_dir: &Path) -> Result<(String, String)> {
    let cache_path = build_dir.join("CMakeCache.txt");
    let cache = std::fs::read_to_string(&cache_path)
        .with_context(|| format!("reading {}", cache_path.display()))?;
    let cxx = cmake_cache_value(&cache, "CMAKE_CXX_COMPILER")
        .filter(|c| !c.is_empty())
        .with_context(|| format!("{} names no CMAKE_CXX_COMPILER", cache_path.display()))?;
    Ok((cxx, cache))
}

/// Compiles bench/tools/logits.cpp into `<build>/bin/flashrt-logits` against that build's
/// libllama, with the C++ compiler and executable link flags the build was configured with (a
/// CUDA build linked against the driver stub needs its --allow-shlib-undefined). Skipped while the
/// binary is newer than the source and libllama: a new libllama may come with other llama.h
/// structs, which the tool passes by value.
pub fn logits_tool(sh: &Shell, project: &Project, build_dir: &Path) -> Result<PathBuf> {
    let bin = build_dir.join("bin");
    let source = project.root.join("bench/tools/logits.cpp");
    let library = bin.join("libllama.so");
    let exe = bin.join("flashrt-logits");
    if !library.is_file() {
        bail!(
            "{} is missing: the build did not produce the llama library",
            library.display()
        );
    }
    if !is_stale(&exe, &[&source, &library])? {
        return Ok(exe);
    }
    let (cxx, cache) = cmake_cxx_compiler(build_dir)?;
    let link_flags: Vec<String> = cmake_cache_value(&cache, "CMAKE_EXE_LINKER_FLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let pristine = project.pristine_dir("llama.cpp");
    let include = pristine.join("include");
    let ggml_include = pristine.join("ggml/include");
    // Through a temporary name: a failed compile must not leave a binary that looks current.
    let partial = bin.join("flashrt-logits.partial");
    step(format!("compiling bench/tools/logits.cpp with {cxx}"));
    cmd!(
        sh,
        "{cxx} -std=c++17 -O2 -I{include} -I{ggml_include} -o {partial} {source}
            -L{bin} -lllama -lggml -lggml-base -Wl,-rpath,{bin} {link_flags...}"
    )
    .run()
    .context("compiling bench/tools/logits.cpp")?;
    std::fs::rename(&partial, &exe)
        .with_context(|| format!("renaming {} into place", partial.display()))?;
    Ok(exe)
}

/// How the tokens are fed, for the report; a prompt longer than the tokens is refused.
fn feeding(prompt: u32, tokens: u32) -> Result<String> {
    if prompt > tokens {
        bail!("--prompt {prompt} is longer than --tokens {tokens}: the prompt is the first tokens fed");
    }
    Ok(match prompt {
        0 => "one decode step each".to_owned(),
        n => format!("the first {n} in one batch, then one decode step each"),
    })
}

pub fn run(sh: &Shell, project: &Project, args: ParityArgs) -> Result<()> {
    let feeding = feeding(args.prompt, args.tokens)?;
    let prepared = args.target.prepare(sh, project, "parity", "llama")?;
    let tool = logits_tool(sh, project, &prepared.build_dir)?;
    // A fixed text: the pinned tree's README (a few thousand tokens).
    let text = project.pristine_dir("llama.cpp").join("README.md");
    let scratch = project.scratch()?;
    let mut files = Vec::new();
    for setting in [&STOCK, &OVERLAY, &REFERENCE] {
        step(format!("{}: {}", setting.name, setting.what));
        let file = scratch.path().join(format!("{}.logits", setting.name));
        let tool_args: Vec<std::ffi::OsString> = vec![
            prepared.model.clone().into(),
            text.clone().into(),
            args.tokens.to_string().into(),
            file.clone().into(),
            "99".into(),
            args.prompt.to_string().into(),
        ];
        run_tool(&tool, &tool_args, setting.env)
            .with_context(|| format!("the {} run", setting.name))?;
        files.push(file);
    }
    step("comparing the logits position by position");
    let comparison = compare_runs(&files[0], &files[1], &files[2])?;

    let out = match args.out {
        Some(out) => out,
        None => project
            .root
            .join("bench/results")
            .join(bench::result_file_name(
                &bench::today(sh)?,
                &bench::commit(sh, project),
                &prepared.gpu,
                &["parity".to_owned()],
                "tsv",
            )),
    };
    write_atomic(&out, tsv(&comparison.rows).as_bytes())?;
    note(format!("per position: {}", out.display()));
    println!(
        "\n{} · {} · {} tokens, {feeding}\n",
        prepared.gpu,
        prepared.model.display(),
        args.tokens
    );
    print!("{}", table(&comparison));
    within_reference(&comparison.overlay, &comparison.reference)
        .context("the overlay is not quality-neutral")?;
    println!("\nparity: the overlay diverges from stock no more than upstream fusion does");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_at_most_the_tokens_fed() {
        assert_eq!(feeding(0, 256).unwrap(), "one decode step each");
        assert_eq!(
            feeding(256, 256).unwrap(),
            "the first 256 in one batch, then one decode step each"
        );
        let err = feeding(512, 256).unwrap_err().to_string();
        assert!(
            err.contains("--prompt 512") && err.contains("--tokens 256"),
            "{err}"
        );
    }

    /// Writes a flashrt-logits file as the C++ tool does.
    fn write_logits(path: &Path, tokens: &[i32], rows: &[Vec<f32>]) {
        let n_vocab = rows.first().map_or(0, Vec::len) as i32;
        let mut bytes = MAGIC.to_vec();
        for v in [VERSION, n_vocab, tokens.len() as i32].iter().chain(tokens) {
            bytes.extend(v.to_le_bytes());
        }
        for v in rows.iter().flatten() {
            bytes.extend(v.to_le_bytes());
        }
        std::fs::write(path, bytes).unwrap();
    }

    /// Three runs over 4 positions of a 5-token vocabulary; `reference` and `overlay` are stock
    /// plus the given change per position.
    fn three_runs(
        dir: &Path,
        overlay: impl Fn(usize, &mut Vec<f32>),
        reference: impl Fn(usize, &mut Vec<f32>),
    ) -> [PathBuf; 3] {
        let tokens = [7, 1, 4, 2];
        let stock: Vec<Vec<f32>> = (0..4)
            .map(|p| {
                (0..5)
                    .map(|i| (i as f32 - 2.0) * (p as f32 + 1.0))
                    .collect()
            })
            .collect();
        let changed = |f: &dyn Fn(usize, &mut Vec<f32>)| {
            let mut rows = stock.clone();
            for (p, row) in rows.iter_mut().enumerate() {
                f(p, row);
            }
            rows
        };
        let paths = ["stock", "overlay", "reference"].map(|n| dir.join(n));
        write_logits(&paths[0], &tokens, &stock);
        write_logits(&paths[1], &tokens, &changed(&overlay));
        write_logits(&paths[2], &tokens, &changed(&reference));
        paths
    }

    fn compare(paths: &[PathBuf; 3]) -> Result<Comparison> {
        compare_runs(&paths[0], &paths[1], &paths[2])
    }

    #[test]
    fn identical_runs_have_no_divergence_and_pass() {
        let dir = tempfile::tempdir().unwrap();
        let paths = three_runs(dir.path(), |_, _| {}, |_, _| {});
        let c = compare(&paths).unwrap();
        let none = PairStats {
            positions: 4,
            top1_same: 4,
            ..PairStats::default()
        };
        assert_eq!((c.overlay, c.reference), (none, none));
        assert_eq!(c.rows.len(), 4);
        assert_eq!(c.rows[0].token, 7);
        within_reference(&c.overlay, &c.reference).unwrap();
        let text = tsv(&c.rows);
        assert_eq!(text.lines().count(), 5);
        assert!(text
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("0\t7\t0.000000e0\t"));
    }

    #[test]
    fn position_statistics() {
        // Stock [3, 4], test [3, 6]: error 4, norm 25; top-1 both index 1.
        let d = position_diff(&[3.0, 6.0], &[3.0, 4.0]);
        assert_eq!(
            d,
            PositionDiff {
                max_abs: 2.0,
                nmse: 4.0 / 25.0,
                top1_same: true
            }
        );
        assert!(!position_diff(&[5.0, 4.0], &[3.0, 4.0]).top1_same);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }

    #[test]
    fn an_overlay_noisier_than_the_reference_fails_and_an_equal_one_passes() {
        let dir = tempfile::tempdir().unwrap();
        let small = |_: usize, row: &mut Vec<f32>| row[0] += 1e-3;
        let c = compare(&three_runs(dir.path(), small, small)).unwrap();
        assert_eq!(c.overlay, c.reference);
        within_reference(&c.overlay, &c.reference).unwrap();

        let large = |_: usize, row: &mut Vec<f32>| row[0] += 1e-2;
        let c = compare(&three_runs(dir.path(), large, small)).unwrap();
        let err = format!(
            "{:#}",
            within_reference(&c.overlay, &c.reference).unwrap_err()
        );
        assert!(err.contains("mean NMSE"), "{err}");
    }

    #[test]
    fn the_top1_allowance_follows_the_reference_agreement() {
        let pair = |positions, top1_same| PairStats {
            positions,
            top1_same,
            ..PairStats::default()
        };
        assert_eq!(top1_allowance(&pair(256, 256)), 1);
        assert_eq!(top1_allowance(&pair(256, 255)), 2);
        // The device's random-weight qwen36: 104/256, two standard deviations are 15.7 positions.
        assert_eq!(top1_allowance(&pair(256, 104)), 16);
        within_reference(&pair(256, 88), &pair(256, 104)).unwrap();
        assert!(within_reference(&pair(256, 87), &pair(256, 104)).is_err());
        assert!(within_reference(&pair(256, 253), &pair(256, 256)).is_err());
    }

    #[test]
    fn top1_agreement_may_trail_a_fully_agreeing_reference_by_one_position() {
        let dir = tempfile::tempdir().unwrap();
        // Stock's top-1 is the last token; lifting the first above it flips the choice. That adds
        // error too, so every other position of both runs gets a change of the same size that
        // keeps the choice: the NMSE is then equal and only top-1 agreement differs.
        let flip = |row: &mut Vec<f32>| row[0] = row[4] + 1.0;
        let same_size = |row: &mut Vec<f32>| row[1] -= row[4] + 1.0 - row[0];
        let one_flip = compare(&three_runs(
            dir.path(),
            |p, row| if p == 0 { flip(row) } else { same_size(row) },
            |_, row| same_size(row),
        ))
        .unwrap();
        assert_eq!(
            (one_flip.overlay.top1_same, one_flip.reference.top1_same),
            (3, 4)
        );
        within_reference(&one_flip.overlay, &one_flip.reference).unwrap();

        let two_flips = compare(&three_runs(
            dir.path(),
            |p, row| if p < 2 { flip(row) } else { same_size(row) },
            |_, row| same_size(row),
        ))
        .unwrap();
        assert_eq!(two_flips.overlay.top1_same, 2);
        let err = format!(
            "{:#}",
            within_reference(&two_flips.overlay, &two_flips.reference).unwrap_err()
        );
        assert!(err.contains("top-1 agreement 2/4"), "{err}");
    }

    #[test]
    fn a_bit_identical_reference_leaves_only_the_absolute_slack() {
        let zero = PairStats {
            positions: 4,
            top1_same: 4,
            ..PairStats::default()
        };
        let tiny = PairStats {
            nmse_sum: 4.0 * 5e-13,
            ..zero
        };
        within_reference(&tiny, &zero).unwrap();
        let small = PairStats {
            nmse_sum: 4.0 * 1e-9,
            ..zero
        };
        assert!(within_reference(&small, &zero).is_err());
    }

    #[test]
    fn nan_inf_mismatched_tokens_and_bad_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let paths = three_runs(
            dir.path(),
            |p, row| {
                if p == 2 {
                    row[3] = f32::NAN
                }
            },
            |_, _| {},
        );
        let err = format!("{:#}", compare(&paths).unwrap_err());
        assert!(
            err.contains("overlay run produced NaN at position 2 (token 4), logit 3"),
            "{err}"
        );

        let paths = three_runs(
            dir.path(),
            |_, _| {},
            |p, row| {
                if p == 1 {
                    row[0] = f32::INFINITY
                }
            },
        );
        let err = format!("{:#}", compare(&paths).unwrap_err());
        assert!(
            err.contains("reference run produced inf at position 1"),
            "{err}"
        );

        let paths = three_runs(dir.path(), |_, _| {}, |_, _| {});
        write_logits(&paths[2], &[7, 1, 5, 2], &vec![vec![0.0; 5]; 4]);
        let err = format!("{:#}", compare(&paths).unwrap_err());
        assert!(
            err.contains("reference run was fed other tokens than stock: position 2"),
            "{err}"
        );

        write_logits(&paths[1], &[7, 1, 4, 2], &vec![vec![0.0; 6]; 4]);
        let err = format!("{:#}", compare(&paths).unwrap_err());
        assert!(
            err.contains("overlay run has 4 positions × 6 logits"),
            "{err}"
        );

        // Cut short: the header promises more than the file holds.
        let bytes = std::fs::read(&paths[0]).unwrap();
        std::fs::write(&paths[0], &bytes[..bytes.len() - 4]).unwrap();
        let err = format!("{:#}", compare(&paths).unwrap_err());
        assert!(
            err.contains("the stock run's logits") && err.contains("cut short"),
            "{err}"
        );

        std::fs::write(&paths[0], b"GGUF and more bytes than a header").unwrap();
        assert!(format!("{:#}", compare(&paths).unwrap_err()).contains("no FRTLOGITS magic"));
    }

    #[test]
    fn the_compiler_comes_from_the_cmake_cache_and_rebuilds_follow_mtimes() {
        let cache = "// comment\nCMAKE_CXX_COMPILER_AR:FILEPATH=/usr/bin/gcc-ar\n\
            CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/c++\n\
            CMAKE_EXE_LINKER_FLAGS:STRING=-Wl,--allow-shlib-undefined\n";
        assert_eq!(
            cmake_cache_value(cache, "CMAKE_CXX_COMPILER").as_deref(),
            Some("/usr/bin/c++")
        );
        assert_eq!(
            cmake_cache_value(cache, "CMAKE_EXE_LINKER_FLAGS").as_deref(),
            Some("-Wl,--allow-shlib-undefined")
        );
        assert_eq!(cmake_cache_value(cache, "CMAKE_CXX_FLAGS"), None);

        let dir = tempfile::tempdir().unwrap();
        let (source, exe) = (dir.path().join("a.cpp"), dir.path().join("a"));
        std::fs::write(&source, "").unwrap();
        assert!(is_stale(&exe, &[&source]).unwrap());
        std::fs::write(&exe, "").unwrap();
        let set_age = |path: &Path, secs_ago: u64| {
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs_ago);
            File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        };
        set_age(&source, 100);
        set_age(&exe, 50);
        assert!(!is_stale(&exe, &[&source]).unwrap());
        set_age(&source, 10);
        assert!(is_stale(&exe, &[&source]).unwrap());
    }
}
