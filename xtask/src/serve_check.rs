//! `cargo xtask serve-check`: llama-server under concurrent load, stock against the overlay.
//!
//! A server does what llama-bench never does: several sequences decode in one batch, requests come
//! and go mid-step, clients hang up, prompts do not fit. This command starts llama-server (the
//! overlay build) once per mode, stock (`GGML_CUDA_FLASHRT_DISABLE=1`) then the overlay, sends
//! the same planned requests in concurrent rounds, and checks per mode that nothing is lost: every
//! request answered (or refused, for the prompt that does not fit), no error, the server alive.
//! Greedy answers are compared with a one-request-at-a-time stock run: batch composition changes
//! rounding, so stock under load does not agree with itself on every request, and the overlay
//! passes when its agreement is within two binomial standard deviations of stock's. Resident
//! memory is read after each round: stock's llama-server grows under this load by itself, so the
//! overlay's growth is judged against stock's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use xshell::Shell;

use crate::bench::{commit, today};
use crate::build::{self, BuildArgs};
use crate::doctor;
use crate::project::Project;
use crate::server::Server;
use crate::synth::{self, Preset};

#[derive(Debug, Args)]
pub struct ServeCheckArgs {
    /// The GGUF to serve. Default: the preset, written once by `synth --stable` (a model whose
    /// greedy answers hardly depend on batch composition, so that answers can be compared).
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// The synth preset when no --model is given.
    #[arg(long, value_enum, default_value = "qwen36-35b-a3b")]
    pub preset: Preset,
    /// Seed of the synth preset.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CUDA architecture to build for (default: the host's default).
    #[arg(long, value_name = "ARCH", conflicts_with = "cpu")]
    pub arch: Option<String>,
    /// Use this local checkout, extracted tree or archive as the host source (must match the pin).
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub host_src: Option<PathBuf>,
    #[command(flatten)]
    pub load: Load,
    /// Run the CPU build instead (no GPU needed: checks the server and this command; stock and
    /// overlay are the same code there, so one mode is run).
    #[arg(long)]
    pub cpu: bool,
    /// Keep each finished part (the reference answers, each mode's rounds) in DIR, and skip the
    /// parts already there when run again with the same load, model and server arguments: a check
    /// longer than a machine lets one command run is done in several runs. The report is written
    /// by the run that finishes the last part.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// The parts this run may do, of `reference`, `stock` and `overlay` (`cpu` with --cpu);
    /// default all. The modes need the reference: it comes first, or from --resume DIR.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "PART,...",
        requires = "resume"
    )]
    pub parts: Vec<String>,
    /// More llama-server arguments, after `--` (e.g. `-- --cont-batching`).
    #[arg(last = true, value_name = "SERVER ARGS")]
    pub server_args: Vec<String>,
}

/// The load put on the server.
#[derive(Debug, Args, Clone)]
pub struct Load {
    /// Server slots (llama-server -np): sequences decoded together.
    #[arg(long, default_value_t = 8)]
    pub slots: u32,
    /// Context of each slot in tokens (llama-server -c is slots x this).
    #[arg(long, default_value_t = 1024)]
    pub slot_ctx: u32,
    /// Requests in a round.
    #[arg(long, default_value_t = 256)]
    pub requests: usize,
    /// Rounds per mode (memory is read after each).
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Clients sending at once (default: twice the slots, so requests queue).
    #[arg(long)]
    pub clients: Option<usize>,
}

/// What a planned request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A greedy completion, answered in full and compared with the reference.
    Complete,
    /// A streamed completion whose client hangs up after a few tokens.
    HangUp,
    /// A prompt longer than a slot's context: refused with an error, or answered; the server
    /// must stay up either way.
    TooLong,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub kind: Kind,
    pub prompt: String,
    pub n_predict: u32,
}

const WORDS: &[&str] = &[
    "the", "river", "north", "quiet", "engine", "seven", "lamp", "orbit", "paper", "stone",
    "winter", "market", "violet", "signal", "harbor", "cloud", "ladder", "garden", "copper",
    "mirror", "thunder", "basket", "island", "forest",
];

/// The requests of a round, the same for every mode and round: prompts of 3 to ~200 words,
/// 8 to 128 tokens to generate; every 16th a client that hangs up; the last one too long for a
/// slot (`slot_ctx` tokens; a word is at least one token).
pub fn plan(requests: usize, slot_ctx: u32) -> Vec<Planned> {
    (0..requests)
        .map(|i| {
            let kind = if i + 1 == requests && requests > 1 {
                Kind::TooLong
            } else if i % 16 == 7 {
                Kind::HangUp
            } else {
                Kind::Complete
            };
            let words = match kind {
                Kind::TooLong => slot_ctx as usize + 64,
                _ => 3 + (i * 37) % 197,
            };
            let prompt: Vec<&str> = (0..words)
                .map(|w| WORDS[(i * 7 + w * 5 + w / 3) % WORDS.len()])
                .collect();
            Planned {
                kind,
                prompt: format!("{} {i}", prompt.join(" ")),
                n_predict: [8, 32, 64, 128][i % 4],
            }
        })
        .collect()
}

fn body(p: &Planned, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "prompt": p.prompt,
        "n_predict": p.n_predict,
        "temperature": 0,
        "ignore_eos": true,
        "cache_prompt": false,
        "stream": stream,
    })
}

/// What became of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Answered in full: its text and tokens.
    Answered { text: String, tokens: u64 },
    /// The client hung up as planned (after this many events).
    HungUp { events: usize },
    /// Refused by the server with this status (expected only for the prompt that does not fit).
    Refused { status: u16 },
    /// Anything else: an error, a malformed answer, a lost connection.
    Failed { why: String },
}

#[derive(Debug, Clone)]
pub struct Done {
    pub index: usize,
    pub outcome: Outcome,
    pub seconds: f64,
}

fn send(server: &Server, p: &Planned) -> Outcome {
    match p.kind {
        Kind::HangUp => match server.post_and_hang_up("/completion", &body(p, true), 3) {
            Ok(events) => Outcome::HungUp { events },
            Err(e) => Outcome::Failed {
                why: format!("{e:#}"),
            },
        },
        Kind::Complete | Kind::TooLong => match server.post("/completion", &body(p, false)) {
            Ok((200, text)) => match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(answer) => match (
                    answer["content"].as_str(),
                    answer["tokens_predicted"].as_u64(),
                ) {
                    (Some(content), Some(tokens)) => Outcome::Answered {
                        text: content.to_owned(),
                        tokens,
                    },
                    _ => Outcome::Failed {
                        why: format!("an answer without content or tokens_predicted: {text}"),
                    },
                },
                Err(e) => Outcome::Failed {
                    why: format!("not JSON ({e}): {text}"),
                },
            },
            Ok((status, _)) if p.kind == Kind::TooLong && (400..500).contains(&status) => {
                Outcome::Refused { status }
            }
            Ok((status, text)) => Outcome::Failed {
                why: format!("status {status}: {text}"),
            },
            Err(e) => Outcome::Failed {
                why: format!("{e:#}"),
            },
        },
    }
}

/// Every planned request sent by `clients` threads at once; results in plan order.
fn round(server: &Server, planned: &[Planned], clients: usize) -> (Vec<Done>, f64) {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(planned.len()));
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..clients.max(1) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = planned.get(index) else { break };
                let sent = Instant::now();
                let outcome = send(server, p);
                let seconds = sent.elapsed().as_secs_f64();
                done.lock().unwrap().push(Done {
                    index,
                    outcome,
                    seconds,
                });
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|d| d.index);
    (done, wall)
}

/// The tally of one mode over its rounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Tally {
    pub sent: usize,
    pub answered: usize,
    pub hung_up: usize,
    pub refused: usize,
    pub failed: usize,
    /// Requests sent but with no outcome (a client thread that died).
    pub lost: usize,
    /// Completions whose text equals the one-at-a-time reference, of those compared.
    pub agree: usize,
    pub compared: usize,
    pub tokens: u64,
    pub wall_seconds: f64,
    pub p50_seconds: f64,
    pub p99_seconds: f64,
    /// Resident memory after each round, bytes.
    pub resident_after_round: Vec<u64>,
    pub first_failures: Vec<String>,
}

impl Tally {
    pub fn tokens_per_second(&self) -> f64 {
        if self.wall_seconds > 0.0 {
            self.tokens as f64 / self.wall_seconds
        } else {
            0.0
        }
    }

    pub fn agreement(&self) -> f64 {
        if self.compared == 0 {
            0.0
        } else {
            self.agree as f64 / self.compared as f64
        }
    }

    fn add_round(
        &mut self,
        planned: &[Planned],
        done: &[Done],
        wall: f64,
        reference: &[Option<String>],
    ) {
        self.sent += planned.len();
        self.lost += planned.len().saturating_sub(done.len());
        self.wall_seconds += wall;
        for d in done {
            match &d.outcome {
                Outcome::Answered { text, tokens } => {
                    self.answered += 1;
                    self.tokens += tokens;
                    if planned[d.index].kind == Kind::Complete {
                        if let Some(Some(want)) = reference.get(d.index) {
                            self.compared += 1;
                            self.agree += usize::from(want == text);
                        }
                    }
                }
                Outcome::HungUp { .. } => self.hung_up += 1,
                Outcome::Refused { .. } => self.refused += 1,
                Outcome::Failed { why } => {
                    self.failed += 1;
                    if self.first_failures.len() < 5 {
                        self.first_failures
                            .push(format!("request {}: {why}", d.index));
                    }
                }
            }
        }
    }
}

/// The value below which a fraction `q` of `values` lie (nearest rank).
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The lowest agreement the overlay may have: stock's own, less two binomial standard deviations
/// of a rate measured on `compared` requests.
pub fn agreement_floor(stock: &Tally) -> f64 {
    let p = stock.agreement();
    let n = stock.compared.max(1) as f64;
    p - 2.0 * (p * (1.0 - p) / n).sqrt()
}

/// Resident memory growth from the first round to the last, bytes (0 when it shrank).
pub fn memory_growth(resident: &[u64]) -> u64 {
    match (resident.first(), resident.last()) {
        (Some(&first), Some(&last)) => last.saturating_sub(first),
        _ => 0,
    }
}

/// Whether the overlay's server grew no more than stock's under the same load, give or take 5% of
/// its first reading or 64 MiB, whichever is more (allocator noise). Stock's llama-server grows by
/// itself under this load (on the H200 ~65 MiB a round of 256 requests, with its prompt cache
/// off): a leak of the overlay's shows as growth beyond it.
pub fn memory_no_worse(stock: &[u64], overlay: &[u64]) -> bool {
    let slack = (overlay.first().copied().unwrap_or(0) / 20).max(64 << 20);
    memory_growth(overlay) <= memory_growth(stock) + slack
}

/// Why a mode fails, if it does (empty: it passes).
pub fn problems(t: &Tally, alive: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !alive {
        out.push("the server died".into());
    }
    if t.failed > 0 {
        out.push(format!(
            "{} request(s) failed: {}",
            t.failed,
            t.first_failures.join("; ")
        ));
    }
    if t.lost > 0 {
        out.push(format!("{} request(s) lost", t.lost));
    }
    out
}

struct Mode {
    name: &'static str,
    env: Vec<(String, String)>,
}

pub fn run(sh: &Shell, project: &Project, args: ServeCheckArgs) -> Result<()> {
    let load = &args.load;
    if load.requests < 2 || load.rounds == 0 || load.slots == 0 {
        bail!("serve-check needs --requests >= 2, --rounds >= 1 and --slots >= 1");
    }
    let device = if args.cpu {
        "cpu".to_owned()
    } else {
        match doctor::gpus(sh) {
            Ok(gpus) => gpus[0].0.clone(),
            Err(why) => bail!(
                "no NVIDIA GPU visible ({why}): serve-check compares stock and the overlay on the CUDA \
                 build; run it on a GPU machine, or pass --cpu to check the server on the CPU build"
            ),
        }
    };
    let built = build::build(
        sh,
        project,
        &BuildArgs {
            arch: args.arch.iter().cloned().collect(),
            cpu: args.cpu,
            targets: vec!["llama-server".into()],
            host_src: args.host_src.clone(),
            ..BuildArgs::new("llama.cpp")
        },
    )?;
    let binary = built.build_dir.join("bin").join("llama-server");
    let model = match &args.model {
        Some(model) => model.clone(),
        None => synth::ensure_stable_model(sh, project, args.preset, args.seed)?,
    };
    let Some(report) = check(
        &binary,
        &model,
        load,
        args.cpu,
        &args.server_args,
        &project.work().join("serve-check"),
        args.resume.as_deref(),
        &args.parts,
    )?
    else {
        return Ok(()); // parts left for a later run with the same --resume DIR (check said which)
    };
    let md = markdown(&report, &device, &model);
    println!("{md}");
    let dir = project.root.join("bench").join("results");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let slug = device
        .to_lowercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let stem = format!("{}-{}-{slug}-serve-check", today(sh)?, commit(sh, project));
    std::fs::write(dir.join(format!("{stem}.md")), &md).context("writing the report")?;
    std::fs::write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&report).context("serializing the report")?,
    )
    .context("writing the report's JSON")?;
    println!("results: {}", dir.join(format!("{stem}.md")).display());
    if !report.verdict.is_empty() {
        bail!("serve-check failed:\n  {}", report.verdict.join("\n  "));
    }
    Ok(())
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub slots: u32,
    pub slot_ctx: u32,
    pub requests: usize,
    pub rounds: usize,
    pub clients: usize,
    pub modes: Vec<(String, Tally)>,
    pub agreement_floor: Option<f64>,
    /// Why the check fails; empty when it passes.
    pub verdict: Vec<String>,
}

/// What a check has finished, kept in the --resume directory between runs.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    /// The load, model and server arguments the parts ran with.
    pub key: String,
    /// The one-at-a-time answers (None for requests that are not compared).
    pub reference: Option<Vec<Option<String>>>,
    /// The finished modes: name, tally, and why it fails (empty: it passes).
    pub modes: Vec<(String, Tally, Vec<String>)>,
}

const PROGRESS_FILE: &str = "serve-check-progress.json";

/// What the parts of a check must share to be put together: the load, the model and the server's
/// arguments.
pub fn progress_key(load: &Load, clients: usize, model: &Path, server_args: &[String]) -> String {
    format!(
        "{} slots x {} tokens, {} requests x {} rounds, {clients} clients, {}, server args {:?}",
        load.slots,
        load.slot_ctx,
        load.requests,
        load.rounds,
        model.display(),
        server_args
    )
}

/// The progress in `dir` for `key`: empty when there is none yet; an error when `dir` holds
/// another check's parts.
pub fn load_progress(dir: &Path, key: &str) -> Result<Progress> {
    let path = dir.join(PROGRESS_FILE);
    if !path.exists() {
        return Ok(Progress {
            key: key.to_owned(),
            ..Progress::default()
        });
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let progress: Progress =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if progress.key != key {
        bail!(
            "{} holds the parts of another check ({}); pass another --resume DIR, or delete it to start over",
            path.display(),
            progress.key
        );
    }
    Ok(progress)
}

/// Writes the progress to `dir`, through a temporary file: a run stopped mid-write leaves the
/// previous progress intact.
pub fn save_progress(dir: &Path, progress: &Progress) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(PROGRESS_FILE);
    let partial = dir.join(format!("{PROGRESS_FILE}.partial"));
    let text = serde_json::to_string_pretty(progress).context("serializing the progress")?;
    std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &path).with_context(|| format!("writing {}", path.display()))
}

/// llama-server's arguments for `model` under `load`; `extra` last, so that they override ours.
/// The prompt cache in host memory is off (`--cache-ram 0`): by default it keeps up to 8 GiB of
/// finished prompts, which grows the server's resident memory round after round and would read as
/// a leak (stock and overlay alike, measured on the H200).
pub fn server_args(model: &Path, load: &Load, cpu: bool, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-m".into(),
        model.display().to_string(),
        "-np".into(),
        load.slots.to_string(),
        "-c".into(),
        (load.slots * load.slot_ctx).to_string(),
        "--cache-ram".into(),
        "0".into(),
    ];
    if cpu {
        args.push("-nr".into()); // the CPU repack path crashes on batched prompts on some machines
    } else {
        args.extend(["-ngl", "99", "-fa", "on"].map(String::from));
    }
    args.extend(extra.iter().cloned());
    args
}

/// Runs the reference and every mode against `binary` serving `model` (the CPU build's one mode
/// with `cpu`; `extra` more llama-server arguments); logs go to `logs`. With `resume`, each
/// finished part is kept there and the parts already there are taken from it; `parts` (empty:
/// all) limits what this run does. None: parts are left for a later run (this says which).
#[allow(clippy::too_many_arguments)]
pub fn check(
    binary: &Path,
    model: &Path,
    load: &Load,
    cpu: bool,
    extra: &[String],
    logs: &Path,
    resume: Option<&Path>,
    parts: &[String],
) -> Result<Option<Report>> {
    std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
    let planned = plan(load.requests, load.slot_ctx);
    let clients = load.clients.unwrap_or(2 * load.slots as usize);
    let server_args = server_args(model, load, cpu, extra);
    let stock_env = vec![("GGML_CUDA_FLASHRT_DISABLE".to_owned(), "1".to_owned())];
    let modes = if cpu {
        vec![Mode {
            name: "cpu",
            env: Vec::new(),
        }]
    } else {
        vec![
            Mode {
                name: "stock",
                env: stock_env.clone(),
            },
            Mode {
                name: "overlay",
                env: vec![("GGML_CUDA_FLASHRT_DISABLE".to_owned(), "0".to_owned())],
            },
        ]
    };

    let known: Vec<&str> = std::iter::once("reference")
        .chain(modes.iter().map(|m| m.name))
        .collect();
    if let Some(unknown) = parts.iter().find(|p| !known.contains(&p.as_str())) {
        bail!("--parts: no part {unknown} (here: {})", known.join(", "));
    }
    let may = |part: &str| parts.is_empty() || parts.iter().any(|p| p == part);
    let key = progress_key(load, clients, model, &server_args);
    let mut progress = match resume {
        Some(dir) => load_progress(dir, &key)?,
        None => Progress {
            key,
            ..Progress::default()
        },
    };
    let save = |progress: &Progress| match resume {
        Some(dir) => save_progress(dir, progress),
        None => Ok(()),
    };

    // The reference: stock, one request at a time.
    let reference: Vec<Option<String>> = if let Some(done) = &progress.reference {
        println!("serve-check: reference from the earlier run");
        done.clone()
    } else if !may("reference") {
        bail!("the reference is not done yet: run with --parts reference (and the same --resume DIR) first");
    } else {
        println!(
            "serve-check: reference, {} completions one at a time (stock)",
            planned.iter().filter(|p| p.kind == Kind::Complete).count()
        );
        let answers: Vec<Option<String>> = {
            let server = Server::start(
                binary,
                &server_args,
                &stock_env,
                &logs.join("reference.log"),
                Duration::from_secs(600),
            )?;
            // Only the completions are compared: the others are not sent.
            planned
                .iter()
                .map(|p| {
                    if p.kind != Kind::Complete {
                        return Ok(None);
                    }
                    match send(&server, p) {
                        Outcome::Answered { text, .. } => Ok(Some(text)),
                        other => bail!("the reference run (stock, alone) failed: {other:?}"),
                    }
                })
                .collect::<Result<_>>()?
        };
        progress.reference = Some(answers.clone());
        save(&progress)?;
        answers
    };

    for mode in &modes {
        if progress.modes.iter().any(|m| m.0 == mode.name) {
            println!("serve-check: {} from the earlier run", mode.name);
            continue;
        }
        if !may(mode.name) {
            continue;
        }
        let log = logs.join(format!("{}.log", mode.name));
        let mut server = Server::start(
            binary,
            &server_args,
            &mode.env,
            &log,
            Duration::from_secs(600),
        )?;
        let mut tally = Tally::default();
        let mut latencies = Vec::new();
        for r in 0..load.rounds {
            let (done, wall) = round(&server, &planned, clients);
            latencies.extend(
                done.iter()
                    .filter(|d| {
                        matches!(d.outcome, Outcome::Answered { .. })
                            && planned[d.index].kind == Kind::Complete
                    })
                    .map(|d| d.seconds),
            );
            tally.add_round(&planned, &done, wall, &reference);
            tally
                .resident_after_round
                .push(server.resident_bytes().unwrap_or(0));
            println!(
                "serve-check: {} round {}/{}: {} answered, {} hung up, {} refused, {} failed, {:.1} s",
                mode.name,
                r + 1,
                load.rounds,
                tally.answered,
                tally.hung_up,
                tally.refused,
                tally.failed,
                wall
            );
        }
        tally.p50_seconds = percentile(&latencies, 0.50);
        tally.p99_seconds = percentile(&latencies, 0.99);
        let alive = server.running() && server.healthy();
        let failing = problems(&tally, alive)
            .into_iter()
            .map(|problem| format!("{}: {problem} (log: {})", mode.name, log.display()))
            .collect();
        progress.modes.push((mode.name.to_owned(), tally, failing));
        save(&progress)?;
    }
    let left: Vec<&str> = modes
        .iter()
        .map(|m| m.name)
        .filter(|name| !progress.modes.iter().any(|m| m.0 == *name))
        .collect();
    if !left.is_empty() {
        println!(
            "serve-check: parts left: {} (run again with the same --resume DIR and --parts {})",
            left.join(", "),
            left.join(",")
        );
        return Ok(None);
    }
    let mut tallies = Vec::new();
    let mut verdict = Vec::new();
    for mode in &modes {
        if let Some((name, tally, failing)) = progress.modes.iter().find(|m| m.0 == mode.name) {
            tallies.push((name.clone(), tally.clone()));
            verdict.extend(failing.iter().cloned());
        }
    }
    let floor = match (
        tallies.iter().find(|t| t.0 == "stock"),
        tallies.iter().find(|t| t.0 == "overlay"),
    ) {
        (Some((_, stock)), Some((_, overlay))) => {
            let floor = agreement_floor(stock);
            if !memory_no_worse(&stock.resident_after_round, &overlay.resident_after_round) {
                verdict.push(format!(
                    "overlay: resident memory grew by {} MiB over the rounds, stock's by {} MiB",
                    memory_growth(&overlay.resident_after_round) >> 20,
                    memory_growth(&stock.resident_after_round) >> 20
                ));
            }
            if overlay.agreement() < floor {
                verdict.push(format!(
                    "overlay: agreement with the reference {:.3} is below stock's {:.3} less two standard deviations ({:.3})",
                    overlay.agreement(),
                    stock.agreement(),
                    floor
                ));
            }
            Some(floor)
        }
        _ => None,
    };
    Ok(Some(Report {
        slots: load.slots,
        slot_ctx: load.slot_ctx,
        requests: load.requests,
        rounds: load.rounds,
        clients,
        modes: tallies,
        agreement_floor: floor,
        verdict,
    }))
}

pub fn markdown(r: &Report, device: &str, model: &Path) -> String {
    let mut s = format!(
        "# serve-check: {device}, {}\n\n{} slots x {} tokens of context, {} clients, {} requests a round, {} rounds per mode; \
         agreement: greedy text identical to stock's one-at-a-time answer\n\n",
        model.display(),
        r.slots,
        r.slot_ctx,
        r.clients,
        r.requests,
        r.rounds
    );
    s += "| mode | sent | answered | hung up (planned) | refused (too long) | failed | lost | agreement | tok/s | p50 s | p99 s | memory MiB, first → last round |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (name, t) in &r.modes {
        s += &format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {}/{} ({:.3}) | {:.1} | {:.2} | {:.2} | {} → {} |\n",
            t.sent,
            t.answered,
            t.hung_up,
            t.refused,
            t.failed,
            t.lost,
            t.agree,
            t.compared,
            t.agreement(),
            t.tokens_per_second(),
            t.p50_seconds,
            t.p99_seconds,
            t.resident_after_round.first().unwrap_or(&0) >> 20,
            t.resident_after_round.last().unwrap_or(&0) >> 20
        );
    }
    if let Some(floor) = r.agreement_floor {
        s += &format!("\nThe overlay's agreement must be at least {floor:.3} (stock's less two binomial standard deviations).\n");
        s += "Its resident memory may grow over the rounds no more than stock's, give or take 5% or 64 MiB.\n";
    }
    if let (Some((_, stock)), Some((_, overlay))) = (
        r.modes.iter().find(|m| m.0 == "stock"),
        r.modes.iter().find(|m| m.0 == "overlay"),
    ) {
        if stock.tokens_per_second() > 0.0 {
            s += &format!(
                "\nAggregate tok/s, overlay / stock: {:.3}\n",
                overlay.tokens_per_second() / stock.tokens_per_second()
            );
        }
    }
    s += &format!(
        "\nVerdict: {}\n",
        if r.verdict.is_empty() {
            "pass".to_owned()
        } else {
            format!("FAIL\n\n- {}", r.verdict.join("\n- "))
        }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_load() -> Load {
        Load {
            slots: 2,
            slot_ctx: 256,
            requests: 4,
            rounds: 1,
            clients: None,
        }
    }

    fn tally(agree: usize, compared: usize) -> Tally {
        Tally {
            sent: 4,
            answered: compared,
            agree,
            compared,
            tokens: 100,
            wall_seconds: 2.0,
            resident_after_round: vec![1 << 30],
            ..Tally::default()
        }
    }

    #[test]
    fn progress_survives_a_run_and_refuses_another_checks_directory() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = load_progress(dir.path(), "key a").unwrap();
        assert_eq!(fresh.key, "key a");
        assert!(fresh.reference.is_none() && fresh.modes.is_empty());
        let progress = Progress {
            key: "key a".into(),
            reference: Some(vec![Some("text".into()), None]),
            modes: vec![(
                "stock".into(),
                tally(3, 4),
                vec!["stock: 1 request(s) lost".into()],
            )],
        };
        save_progress(dir.path(), &progress).unwrap();
        assert_eq!(load_progress(dir.path(), "key a").unwrap(), progress);
        assert!(!dir.path().join(format!("{PROGRESS_FILE}.partial")).exists());
        let err = load_progress(dir.path(), "key b").unwrap_err().to_string();
        assert!(
            err.contains("another check") && err.contains("key a"),
            "{err}"
        );
    }

    /// check() of a small GPU load on a server that does not exist, progress in `dir`: only what
    /// runs before any server starts can succeed.
    fn check_without_server(dir: &Path, parts: &[&str]) -> Result<Option<Report>> {
        let parts: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        check(
            Path::new("/nonexistent/llama-server"),
            Path::new("m.gguf"),
            &small_load(),
            false,
            &[],
            &dir.join("logs"),
            Some(dir),
            &parts,
        )
    }

    #[test]
    fn parts_are_checked_and_the_modes_wait_for_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_without_server(dir.path(), &["stock", "bogus"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no part bogus") && err.contains("reference, stock, overlay"),
            "{err}"
        );
        let err = check_without_server(dir.path(), &["stock"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--parts reference"), "{err}");
    }

    #[test]
    fn a_finished_progress_gives_the_report_without_running_anything() {
        let dir = tempfile::tempdir().unwrap();
        // Another check's progress is refused.
        let other = Progress {
            key: "other".into(),
            ..Progress::default()
        };
        save_progress(dir.path(), &other).unwrap();
        let err = check_without_server(dir.path(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("another check"), "{err}");
        let (load, model) = (small_load(), Path::new("m.gguf"));
        let progress = Progress {
            key: progress_key(
                &load,
                2 * load.slots as usize,
                model,
                &server_args(model, &load, false, &[]),
            ),
            reference: Some(vec![Some("a".into()); 3]),
            modes: vec![
                ("overlay".into(), tally(1, 40), vec![]),
                (
                    "stock".into(),
                    tally(38, 40),
                    vec!["stock: the server died".into()],
                ),
            ],
        };
        save_progress(dir.path(), &progress).unwrap();
        let report = check_without_server(dir.path(), &[])
            .unwrap()
            .expect("every part is done");
        assert_eq!(
            report
                .modes
                .iter()
                .map(|m| m.0.as_str())
                .collect::<Vec<_>>(),
            ["stock", "overlay"]
        );
        assert_eq!(report.verdict.len(), 2, "{:?}", report.verdict);
        assert!(report.verdict[0].contains("the server died"));
        assert!(report.verdict[1].contains("below stock's"));
    }

    #[test]
    fn the_server_runs_without_its_prompt_cache_and_extra_arguments_come_last() {
        let load = Load {
            slots: 4,
            slot_ctx: 512,
            requests: 8,
            rounds: 2,
            clients: None,
        };
        let extra = vec!["--cache-ram".to_owned(), "256".to_owned()];
        for cpu in [false, true] {
            let args = server_args(Path::new("m.gguf"), &load, cpu, &extra);
            let ours = args.iter().position(|a| a == "--cache-ram").unwrap();
            assert_eq!(args[ours + 1], "0");
            assert_eq!(args[args.len() - 2..], extra[..]);
            assert_eq!(
                args[args.iter().position(|a| a == "-c").unwrap() + 1],
                "2048"
            );
            assert_eq!(args.contains(&"-nr".to_owned()), cpu);
        }
    }

    #[test]
    fn the_plan_mixes_kinds_lengths_and_outputs_the_same_way_every_time() {
        let a = plan(64, 256);
        assert_eq!(a, plan(64, 256));
        assert_eq!(a.iter().filter(|p| p.kind == Kind::TooLong).count(), 1);
        assert_eq!(a.last().unwrap().kind, Kind::TooLong);
        assert!(a.last().unwrap().prompt.split(' ').count() > 256);
        assert_eq!(a.iter().filter(|p| p.kind == Kind::HangUp).count(), 4);
        let lengths: Vec<usize> = a
            .iter()
            .filter(|p| p.kind == Kind::Complete)
            .map(|p| p.prompt.split(' ').count())
            .collect();
        assert!(
            *lengths.iter().min().unwrap() <= 8 && *lengths.iter().max().unwrap() >= 150,
            "{lengths:?}"
        );
        for n in [8, 32, 64, 128] {
            assert!(a.iter().any(|p| p.n_predict == n));
        }
        // Prompts differ: each names its index.
        let distinct: std::collections::HashSet<&str> =
            a.iter().map(|p| p.prompt.as_str()).collect();
        assert_eq!(distinct.len(), a.len());
    }

    fn planned(kinds: &[Kind]) -> Vec<Planned> {
        kinds
            .iter()
            .map(|&kind| Planned {
                kind,
                prompt: String::new(),
                n_predict: 8,
            })
            .collect()
    }

    fn done(index: usize, outcome: Outcome) -> Done {
        Done {
            index,
            outcome,
            seconds: 0.1,
        }
    }

    #[test]
    fn a_round_is_tallied_against_the_reference() {
        let p = planned(&[
            Kind::Complete,
            Kind::Complete,
            Kind::HangUp,
            Kind::Complete,
            Kind::TooLong,
        ]);
        let reference = vec![
            Some("a".to_owned()),
            Some("b".to_owned()),
            None,
            Some("d".to_owned()),
            None,
        ];
        let answered = |t: &str| Outcome::Answered {
            text: t.into(),
            tokens: 8,
        };
        let round = vec![
            done(0, answered("a")),
            done(1, answered("x")),
            done(2, Outcome::HungUp { events: 3 }),
            // request 3 never came back
            done(4, Outcome::Refused { status: 400 }),
        ];
        let mut t = Tally::default();
        t.add_round(&p, &round, 2.0, &reference);
        assert_eq!(
            (t.sent, t.answered, t.hung_up, t.refused, t.failed, t.lost),
            (5, 2, 1, 1, 0, 1)
        );
        assert_eq!((t.agree, t.compared, t.tokens), (1, 2, 16));
        assert_eq!(t.tokens_per_second(), 8.0);
        assert_eq!(problems(&t, true), vec!["1 request(s) lost".to_owned()]);
        t.add_round(
            &p,
            &[done(
                3,
                Outcome::Failed {
                    why: "reset".into(),
                },
            )],
            1.0,
            &reference,
        );
        let why = problems(&t, false);
        assert!(
            why[0].contains("died") && why[1].contains("request 3: reset"),
            "{why:?}"
        );
    }

    #[test]
    fn the_agreement_floor_is_two_binomial_deviations_under_stock() {
        let stock = Tally {
            agree: 90,
            compared: 100,
            ..Tally::default()
        };
        // p = 0.9, sd = sqrt(0.09 / 100) = 0.03
        assert!((agreement_floor(&stock) - 0.84).abs() < 1e-12);
        let all = Tally {
            agree: 50,
            compared: 50,
            ..Tally::default()
        };
        assert_eq!(agreement_floor(&all), 1.0);
    }

    #[test]
    fn the_overlay_may_grow_as_much_as_stock_but_no_more() {
        let mib = 1u64 << 20;
        let stock = [1000 * mib, 1065 * mib, 1130 * mib, 1195 * mib];
        assert_eq!(memory_growth(&stock), 195 * mib);
        assert_eq!(memory_growth(&[1000 * mib, 900 * mib]), 0);
        assert_eq!(memory_growth(&[]), 0);
        // As much as stock, and within the slack (5% of 1000 MiB) beyond it.
        assert!(memory_no_worse(
            &stock,
            &[1000 * mib, 1100 * mib, 1195 * mib]
        ));
        assert!(memory_no_worse(&stock, &[1000 * mib, 1245 * mib]));
        assert!(!memory_no_worse(
            &stock,
            &[1000 * mib, 1200 * mib, 1400 * mib]
        ));
        // Small servers: 64 MiB of slack; a flat stock leaves only that.
        let flat = [100 * mib, 100 * mib];
        assert!(memory_no_worse(&flat, &[100 * mib, 164 * mib]));
        assert!(!memory_no_worse(&flat, &[100 * mib, 170 * mib]));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
