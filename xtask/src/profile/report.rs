//! From traces to the profile: per-step numbers, kernel families, weight reads; and its Markdown
//! and SVG forms.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

use super::kernel_name::KernelName;
use super::launch_log::{self, LoggedLaunch};
use super::trace::{self, Activity, Trace};
use super::weights::{self, Attribution, WeightTensor};
use super::{Inputs, SettingRun, WindowKernels};
use crate::bench::{self, Bandwidth};

#[derive(Debug, Serialize)]
pub struct Profile {
    pub date: String,
    pub commit: String,
    pub gpu: String,
    pub model: String,
    pub command: String,
    /// The overlay's switches in the environment of every run (profile.rs's `Inputs::switches`).
    pub switches: Vec<(String, String)>,
    /// Tokens decoded per llama-bench run.
    pub tokens: u32,
    /// Tokens in the context before them (llama-bench's -d).
    pub depth: u32,
    /// Weights read per decoded token, from the GGUF header.
    pub bytes_per_token: f64,
    pub bandwidth: Bandwidth,
    pub settings: Vec<SettingProfile>,
}

/// One setting (stock, overlay, overlay without a window), per steady decode step.
#[derive(Debug, Serialize)]
pub struct SettingProfile {
    pub name: String,
    pub env: Vec<(String, String)>,
    /// llama-bench's tok/s without tracing and with it (medians of its samples).
    pub unprofiled_ts: f64,
    pub profiled_ts: f64,
    /// CUDA graph launches in the trace, and records that ran outside graphs (warm-up, copies).
    pub graph_launches: usize,
    pub outside_graphs: usize,
    pub dropped_records: u64,
    pub steady_steps: usize,
    pub kernels_per_step: usize,
    /// Steps left out for another kernel count: (kernels, steps).
    pub other_steps: Vec<(usize, usize)>,
    /// First start to last end of a step.
    pub span_us: f64,
    /// Time anything ran (the union of the step's kernels and copies).
    pub busy_us: f64,
    pub idle_us: f64,
    /// Median start-to-start time of consecutive steps (host time between launches included).
    pub period_us: Option<f64>,
    /// The graph-level run's tok/s and steps (none in profiles saved before it).
    pub graph_ts: Option<f64>,
    pub graph_level: Option<trace::GraphTimes>,
    /// The untraced run's step periods, or why there are none.
    pub periods: Option<super::periods::Periods>,
    pub periods_missing: Option<String>,
    pub families: Vec<FamilyStats>,
    pub weights: Vec<WeightStats>,
    pub unattributed: Vec<Unattributed>,
    /// Sums over the weight-reading kernels' attributed launches.
    pub weight_bytes: f64,
    pub weight_us: f64,
    /// The steady step launch by launch (written as its own file, not into profile.json).
    #[serde(skip)]
    pub timeline: Vec<TimelineRow>,
}

/// One launch of the steady step, in step order: medians over the steady steps.
#[derive(Debug, Clone)]
pub struct TimelineRow {
    pub family: String,
    pub window: Option<String>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// The weights it read, when attributed.
    pub weights: Option<String>,
    /// From the step's first start.
    pub start_us: f64,
    pub duration_us: f64,
    pub exclusive_us: f64,
    /// How long before everything ahead of it in the step had ended it started (programmatic
    /// dependent launch); negative: idle time before it.
    pub early_us: f64,
}

/// One kernel family (or memcpy/memset kind), per step.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyStats {
    pub family: String,
    /// The overlay window whose kernel this is.
    pub window: Option<String>,
    pub launches: f64,
    pub exclusive_us: f64,
    /// Of the busy time.
    pub share: f64,
    pub us_each: f64,
    /// Weight-reading kernels: bytes of the attributed launches, and their rate over those
    /// launches' exclusive time.
    pub bytes: Option<f64>,
    pub tbps: Option<f64>,
    /// tbps against the measured read bandwidth.
    pub read_share: Option<f64>,
}

/// The launches that read one set of weights, per step.
#[derive(Debug, Clone, Serialize)]
pub struct WeightStats {
    /// Tensor roles, e.g. `ffn_gate_exps / ffn_up_exps`.
    pub weights: String,
    pub family: String,
    pub launches: f64,
    pub bytes: f64,
    pub exclusive_us: f64,
    pub tbps: f64,
    pub read_share: f64,
}

/// Launches of a weight-reading kernel whose bytes could not be told, per step.
#[derive(Debug, Clone, Serialize)]
pub struct Unattributed {
    pub family: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub reason: String,
    pub launches: f64,
}

/// A kernel (its name's index) with its grid and block.
type LaunchShape = (usize, [u32; 3], [u32; 3]);

/// The decode GEMV budget of a launch reading `bytes` (issue 10's acceptance): at 60% of the read
/// bandwidth, plus 1.5 µs.
fn gemv_budget_us(bytes: f64, read_tbps: f64) -> f64 {
    bytes / (0.6 * read_tbps * 1e6) + 1.5
}

/// ns and bytes to TB/s.
fn tbps(bytes: f64, ns: f64) -> f64 {
    if ns > 0.0 {
        bytes / ns / 1e3
    } else {
        f64::NAN
    }
}

#[derive(Default)]
struct FamilyTotals {
    window: Option<String>,
    launches: u64,
    exclusive_ns: u64,
    reads_weights: bool,
    bytes: u64,
    attributed_ns: u64,
}

/// The profile of one setting's trace. `launches`: the passes of the overlay's launch log, when
/// the run wrote one (the GEMV windows' kernels get their bytes from it).
pub fn analyse_setting(
    run: &SettingRun,
    trace: &Trace,
    launches: Option<&[Vec<LoggedLaunch>]>,
    tensors: &[WeightTensor],
    windows: &WindowKernels,
    read_tbps: f64,
) -> Result<SettingProfile> {
    let (steps, outside_graphs) = trace::graph_steps(trace);
    let steady = trace::steady_steps(&steps)?;
    let names: Vec<KernelName> = trace.names.iter().map(|n| KernelName::parse(n)).collect();
    let logged = |i: usize| match trace.records[i].activity {
        Activity::Kernel { name, .. } => launch_log::is_logged(names[name].function()),
        _ => false,
    };
    // The capture the steady steps replay: the pass with as many launches as a step has logged
    // kernels.
    let per_step = steady.steps.first().map_or(0, |&s| {
        steps[s].records.iter().filter(|&&i| logged(i)).count()
    });
    let replayed: Result<&[LoggedLaunch], String> = match launches {
        Some(passes) => launch_log::pass_with(passes, per_step),
        None => Err("no launch log (the run did not set GGML_FLASHRT_LAUNCH_LOG)".to_owned()),
    };
    let mut families: BTreeMap<String, FamilyTotals> = BTreeMap::new();
    let mut weight_totals: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    let mut unattributed: BTreeMap<(String, [u32; 3], [u32; 3], String), u64> = BTreeMap::new();
    // Each (kernel, grid, block) once: a step repeats the same few hundred launches.
    let mut memo: HashMap<LaunchShape, Result<Attribution, String>> = HashMap::new();
    let (mut span, mut busy) = (0u64, 0u64);
    let mut periods = Vec::new();
    // Per place in the step: the launch as the first steady step has it, and its times (µs) in
    // every steady step with as many records.
    let places = steady.steps.first().map_or(0, |&s| steps[s].records.len());
    let mut timeline: Vec<TimelineRow> = Vec::with_capacity(places);
    let mut times: Vec<[Vec<f64>; 4]> = vec![Default::default(); places];
    for &s in &steady.steps {
        let step = &steps[s];
        let intervals: Vec<(u64, u64)> = step
            .records
            .iter()
            .map(|&i| (trace.records[i].start, trace.records[i].end))
            .collect();
        let exclusive = trace::exclusive(&intervals);
        span += step.end - step.start;
        busy += exclusive.iter().sum::<u64>();
        if let Some(next) = steps.get(s + 1) {
            periods.push((next.start - step.start) as f64 / 1e3);
        }
        let mut logged_index = 0;
        let timed = step.records.len() == places;
        let mut frontier = step.start;
        for (place, (&i, &ns)) in step.records.iter().zip(&exclusive).enumerate() {
            let record = &trace.records[i];
            let family = match record.activity {
                Activity::Kernel { name, .. } => names[name].family(),
                Activity::Memcpy { direction, .. } => format!("[memcpy {direction}]"),
                Activity::Memset { .. } => "[memset]".to_owned(),
                Activity::Graph => "[graph]".to_owned(),
                Activity::Api { name, .. } => format!("[{}]", trace.names[name]),
            };
            if timed {
                let us = |ns: i64| ns as f64 / 1e3;
                let t = &mut times[place];
                t[0].push(us((record.start - step.start) as i64));
                t[1].push(us((record.end - record.start) as i64));
                t[2].push(us(ns as i64));
                t[3].push(us(frontier as i64 - record.start as i64));
                if timeline.len() == place {
                    let (grid, block) = match record.activity {
                        Activity::Kernel { grid, block, .. } => (grid, block),
                        _ => ([0; 3], [0; 3]),
                    };
                    timeline.push(TimelineRow {
                        family: family.clone(),
                        window: None,
                        grid,
                        block,
                        weights: None,
                        start_us: 0.0,
                        duration_us: 0.0,
                        exclusive_us: 0.0,
                        early_us: 0.0,
                    });
                }
            }
            frontier = frontier.max(record.end);
            let totals = families.entry(family.clone()).or_default();
            totals.launches += 1;
            totals.exclusive_ns += ns;
            let Activity::Kernel { name, grid, block } = record.activity else {
                continue;
            };
            let kernel = &names[name];
            totals.window = windows.window_of(kernel.function());
            if timed {
                timeline[place].window.clone_from(&totals.window);
            }
            let attribution = if launch_log::is_logged(kernel.function()) {
                logged_index += 1;
                &logged_attribution(&replayed, logged_index - 1)
            } else if weights::reads_weights(kernel) {
                memo.entry((name, grid, block))
                    .or_insert_with(|| weights::attribute(kernel, grid, block, tensors))
            } else {
                continue;
            };
            totals.reads_weights = true;
            match attribution {
                Ok(a) => {
                    if timed {
                        timeline[place].weights = Some(a.weights.clone());
                    }
                    totals.bytes += a.bytes;
                    totals.attributed_ns += ns;
                    let w = weight_totals
                        .entry((a.weights.clone(), family))
                        .or_default();
                    w.0 += 1;
                    w.1 += a.bytes;
                    w.2 += ns;
                }
                Err(reason) => {
                    *unattributed
                        .entry((family, grid, block, reason.clone()))
                        .or_default() += 1;
                }
            }
        }
    }
    for (row, t) in timeline.iter_mut().zip(&times) {
        row.start_us = bench::median(&t[0]);
        row.duration_us = bench::median(&t[1]);
        row.exclusive_us = bench::median(&t[2]);
        row.early_us = bench::median(&t[3]);
    }
    let n = steady.steps.len() as f64;
    let busy_us = busy as f64 / 1e3 / n;
    let mut family_stats: Vec<FamilyStats> = families
        .into_iter()
        .map(|(family, t)| {
            let exclusive_us = t.exclusive_ns as f64 / 1e3 / n;
            let rate = t
                .reads_weights
                .then(|| tbps(t.bytes as f64, t.attributed_ns as f64));
            FamilyStats {
                family,
                window: t.window,
                launches: t.launches as f64 / n,
                exclusive_us,
                share: exclusive_us / busy_us,
                us_each: t.exclusive_ns as f64 / 1e3 / t.launches as f64,
                bytes: t.reads_weights.then(|| t.bytes as f64 / n),
                tbps: rate,
                read_share: rate.map(|r| r / read_tbps),
            }
        })
        .collect();
    family_stats.sort_by(|a, b| b.exclusive_us.total_cmp(&a.exclusive_us));
    let mut weight_stats: Vec<WeightStats> = weight_totals
        .into_iter()
        .map(|((weights, family), (launches, bytes, ns))| WeightStats {
            weights,
            family,
            launches: launches as f64 / n,
            bytes: bytes as f64 / n,
            exclusive_us: ns as f64 / 1e3 / n,
            tbps: tbps(bytes as f64, ns as f64),
            read_share: tbps(bytes as f64, ns as f64) / read_tbps,
        })
        .collect();
    weight_stats.sort_by(|a, b| b.exclusive_us.total_cmp(&a.exclusive_us));
    let weight_bytes = weight_stats.iter().map(|w| w.bytes).sum();
    let weight_us = weight_stats.iter().map(|w| w.exclusive_us).sum();
    Ok(SettingProfile {
        name: run.name.clone(),
        env: run.env.clone(),
        unprofiled_ts: bench::median(&run.unprofiled_ts),
        profiled_ts: bench::median(&run.profiled_ts),
        graph_launches: steps.len(),
        outside_graphs,
        dropped_records: trace.dropped,
        steady_steps: steady.steps.len(),
        kernels_per_step: steady.kernels_per_step,
        other_steps: steady.other,
        span_us: span as f64 / 1e3 / n,
        busy_us,
        idle_us: (span - busy) as f64 / 1e3 / n,
        period_us: (!periods.is_empty()).then(|| bench::median(&periods)),
        graph_ts: None,
        graph_level: None,
        periods: None,
        periods_missing: None,
        families: family_stats,
        weights: weight_stats,
        unattributed: unattributed
            .into_iter()
            .map(|((family, grid, block, reason), launches)| Unattributed {
                family,
                grid,
                block,
                reason,
                launches: launches as f64 / n,
            })
            .collect(),
        weight_bytes,
        weight_us,
        timeline,
    })
}

/// A setting's steady step launch by launch, tab-separated (`timeline-<setting>.tsv`): where each
/// kernel starts, how long it runs, its exclusive time and how early it started under programmatic
/// dependent launch, for reading a window's launches in their place.
pub fn timeline_tsv(s: &SettingProfile) -> String {
    let mut out = String::from(
        "place\tfamily\twindow\tgrid\tblock\tweights\tstart_us\tduration_us\texclusive_us\tearly_us\n",
    );
    for (place, r) in s.timeline.iter().enumerate() {
        let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
        let _ = writeln!(
            out,
            "{place}\t{}\t{}\t{}\t{}\t{}\t{:.2}\t{:.2}\t{:.2}\t{:.2}",
            r.family,
            r.window.as_deref().unwrap_or("-"),
            dims(r.grid),
            dims(r.block),
            r.weights.as_deref().unwrap_or("-"),
            r.start_us,
            r.duration_us,
            r.exclusive_us,
            r.early_us
        );
    }
    out
}

/// What the k-th logged kernel of a step read: the k-th launch of the replayed pass.
fn logged_attribution(
    replayed: &Result<&[LoggedLaunch], String>,
    k: usize,
) -> Result<Attribution, String> {
    let launches = replayed.as_ref().map_err(String::clone)?;
    let launch = launches
        .get(k)
        .ok_or_else(|| format!("launch {k} is past the pass's {}", launches.len()))?;
    Ok(Attribution {
        bytes: launch.bytes,
        weights: launch.roles.clone(),
    })
}

/// The whole profile: the inputs' settings, each with its parsed trace and launch log.
pub fn analyse(
    inputs: &Inputs,
    traces: &[Trace],
    graph_traces: &[Option<Trace>],
    launches: &[Option<Vec<Vec<LoggedLaunch>>>],
    windows: &WindowKernels,
) -> Result<Profile> {
    let settings = inputs
        .settings
        .iter()
        .zip(traces)
        .zip(graph_traces)
        .zip(launches)
        .map(|(((run, trace), graph_trace), launches)| {
            let mut setting = analyse_setting(
                run,
                trace,
                launches.as_deref(),
                &inputs.tensors,
                windows,
                inputs.bandwidth.read_tbps,
            )
            .map_err(|e| e.context(format!("the {} trace", run.name)))?;
            if let Some(graph_trace) = graph_trace {
                setting.graph_level = Some(
                    trace::graph_times(graph_trace)
                        .map_err(|e| e.context(format!("the {} graph-level trace", run.name)))?,
                );
                setting.graph_ts = Some(bench::median(&run.graph_ts));
            }
            Ok(setting)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Profile {
        date: inputs.date.clone(),
        commit: inputs.commit.clone(),
        gpu: inputs.gpu.clone(),
        model: inputs.model.clone(),
        command: inputs.command.clone(),
        switches: inputs.switches.clone(),
        tokens: inputs.tokens,
        depth: inputs.depth,
        bytes_per_token: inputs.bytes_per_token,
        bandwidth: inputs.bandwidth.clone(),
        settings,
    })
}

/// The llama-bench test profiled: tgN, or tgN@dDEPTH after a depth prompt (bench's test names).
pub fn test_name(tokens: u32, depth: u32) -> String {
    if depth > 0 {
        format!("tg{tokens}@d{depth}")
    } else {
        format!("tg{tokens}")
    }
}

// ---- Markdown ----

fn count(x: f64) -> String {
    if (x - x.round()).abs() < 0.05 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.filter(|v| v.is_finite()).map_or_else(|| "-".into(), f)
}

/// Families of every setting, by their largest exclusive time.
fn family_order(p: &Profile) -> Vec<String> {
    let mut largest: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &p.settings {
        for f in &s.families {
            let e = largest.entry(&f.family).or_insert(0.0);
            *e = e.max(f.exclusive_us);
        }
    }
    let mut order: Vec<(&str, f64)> = largest.into_iter().collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    order.into_iter().map(|(f, _)| f.to_owned()).collect()
}

fn find<'a>(s: &'a SettingProfile, family: &str) -> Option<&'a FamilyStats> {
    s.families.iter().find(|f| f.family == family)
}

fn row(cells: impl IntoIterator<Item = String>) -> String {
    let cells: Vec<String> = cells.into_iter().collect();
    format!("| {} |\n", cells.join(" | "))
}

fn header(names: &[String], right: usize) -> String {
    let mut out = row(names.iter().cloned());
    out.push('|');
    for i in 0..names.len() {
        out.push_str(if i < names.len() - right {
            "---|"
        } else {
            "---:|"
        });
    }
    out.push('\n');
    out
}

pub fn markdown(p: &Profile) -> String {
    let s = &p.settings;
    let names: Vec<String> = s.iter().map(|x| x.name.clone()).collect();
    let floor_us = p.bytes_per_token / (p.bandwidth.read_tbps * 1e12) * 1e6;
    let mut out = String::new();
    let model = std::path::Path::new(&p.model)
        .file_name()
        .map_or(p.model.clone(), |f| f.to_string_lossy().into_owned());
    let _ = writeln!(out, "# Decode profile: {}, {model}\n", p.gpu);
    let _ = writeln!(
        out,
        "{} · commit {} · {} · read bandwidth {:.2} TB/s · {:.3} GB of weights per token \
         (floor {floor_us:.0} µs) · `{}`\n",
        p.date,
        p.commit,
        test_name(p.tokens, p.depth),
        p.bandwidth.read_tbps,
        p.bytes_per_token / 1e9,
        p.command
    );
    if !p.switches.is_empty() {
        let list: Vec<String> = bench::switch_tags(&p.switches)
            .map(|tag| format!("`{tag}`"))
            .collect();
        let _ = writeln!(
            out,
            "Switches in the environment of every run: {}\n",
            list.join(", ")
        );
    }
    let _ = writeln!(out, "![µs per step by kernel family](profile.svg)\n");

    out.push_str("## Per decode step\n\n");
    let mut cols = vec![String::new()];
    cols.extend(names.iter().cloned());
    out.push_str(&header(&cols, names.len()));
    let line = |label: &str, f: &dyn Fn(&SettingProfile) -> String| {
        let mut cells = vec![label.to_owned()];
        cells.extend(s.iter().map(f));
        row(cells)
    };
    out.push_str(&line("tok/s without tracing", &|x| {
        format!("{:.1}", x.unprofiled_ts)
    }));
    out.push_str(&line("tok/s traced (CUPTI slows the run)", &|x| {
        format!("{:.1}", x.profiled_ts)
    }));
    out.push_str(&line("steady steps (of graph launches)", &|x| {
        format!("{} of {}", x.steady_steps, x.graph_launches)
    }));
    out.push_str(&line("kernels per step", &|x| {
        x.kernels_per_step.to_string()
    }));
    let period = |f: fn(&super::periods::Periods) -> String| {
        move |x: &SettingProfile| x.periods.as_ref().map_or("-".to_owned(), f)
    };
    out.push_str(&line(
        "untraced: median step period µs (call to call)",
        &period(|p| format!("{:.1}", p.median_us)),
    ));
    out.push_str(&line(
        "untraced: mean step period µs (what tok/s pays)",
        &period(|p| format!("{:.1}", p.mean_us)),
    ));
    out.push_str(&line(
        "untraced: periods over twice the median a run, their excess µs a step",
        &period(|p| format!("{:.1}, {:.1}", p.long, p.long_excess_us)),
    ));
    out.push_str(&line(
        "untraced: a run's first steps µs",
        &period(|p| {
            p.first_us
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join(" / ")
        }),
    ));
    out.push_str(&line(
        "untraced: node-loop calls a run (captures, direct steps)",
        &period(|p| format!("{:.1}", p.node_loop_calls)),
    ));
    out.push_str(&line("GPU busy µs", &|x| format!("{:.1}", x.busy_us)));
    out.push_str(&line("idle µs inside the step", &|x| {
        format!("{:.1}", x.idle_us)
    }));
    out.push_str(&line("step span µs (first start to last end)", &|x| {
        format!("{:.1}", x.span_us)
    }));
    out.push_str(&line("step period µs (launch to launch)", &|x| {
        opt(x.period_us, |v| format!("{v:.1}"))
    }));
    let graph = |f: fn(&trace::GraphTimes) -> Option<f64>| {
        move |x: &SettingProfile| opt(x.graph_level.as_ref().and_then(f), |v| format!("{v:.1}"))
    };
    out.push_str(&line(
        "tok/s traced at graph level (one record a graph launch)",
        &|x| opt(x.graph_ts, |v| format!("{v:.1}")),
    ));
    out.push_str(&line(
        "graph-level: GPU span of a step µs",
        &graph(|g| Some(g.span_us)),
    ));
    out.push_str(&line(
        "graph-level: between steps µs (host work, copies)",
        &graph(|g| Some(g.gap_us)),
    ));
    out.push_str(&line(
        "graph-level: copies between steps µs",
        &graph(|g| Some(g.copies_us)),
    ));
    out.push_str(&line(
        "graph-level: step period µs",
        &graph(|g| Some(g.period_us)),
    ));
    out.push_str(&line(
        "graph-level: mean step period µs (what tok/s pays)",
        &graph(|g| Some(g.mean_period_us)),
    ));
    out.push_str(&line(
        "graph-level: gaps over twice the median, and their excess µs a step",
        &|x| match &x.graph_level {
            Some(g) => format!("{}, {:.1}", g.long_gaps.len(), g.long_gaps_us),
            None => "-".to_owned(),
        },
    ));
    out.push_str(&line(
        "graph-level: the host's synchronize returns, µs after the step's end",
        &graph(|g| g.sync_returned_us),
    ));
    out.push_str(&line(
        "graph-level: the next cudaGraphLaunch called, µs after the step's end",
        &graph(|g| g.launch_called_us),
    ));
    out.push_str(&line(
        "graph-level: cudaGraphLaunch call µs",
        &graph(|g| g.launch_call_us),
    ));
    out.push_str(&line(
        "graph-level: from that call to the GPU's start µs",
        &graph(|g| g.launch_to_start_us),
    ));
    out.push_str(&line("weights read per step (attributed)", &|x| {
        format!("{:.3} GB", x.weight_bytes / 1e9)
    }));
    out.push_str(&line("matvec µs, TB/s, share of read bandwidth", &|x| {
        let rate = tbps(x.weight_bytes, x.weight_us * 1e3);
        format!(
            "{:.1}, {}, {}",
            x.weight_us,
            opt(Some(rate), |v| format!("{v:.2}")),
            opt(Some(rate / p.bandwidth.read_tbps), pct)
        )
    }));
    out.push('\n');
    for x in s {
        let mut notes = Vec::new();
        if !x.other_steps.is_empty() {
            let other: Vec<String> = x
                .other_steps
                .iter()
                .map(|(k, n)| format!("{n} × {k} kernels"))
                .collect();
            notes.push(format!("left out: {}", other.join(", ")));
        }
        if x.outside_graphs > 0 {
            notes.push(format!(
                "{} records outside CUDA graphs (warm-up, input and output copies)",
                x.outside_graphs
            ));
        }
        if let Some(why) = &x.periods_missing {
            notes.push(format!("no untraced periods: {why}"));
        }
        if let Some(g) = x.graph_level.as_ref().filter(|g| !g.long_gaps.is_empty()) {
            let listed: Vec<String> = g
                .long_gaps
                .iter()
                .take(8)
                .map(|(k, us)| format!("{us:.0} µs after steady launch {}", k + 1))
                .collect();
            let more = g.long_gaps.len().saturating_sub(8);
            notes.push(format!(
                "graph-level long gaps: {}{}",
                listed.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if x.dropped_records > 0 {
            notes.push(format!(
                "**CUPTI dropped {} records**: the numbers miss them",
                x.dropped_records
            ));
        }
        if !notes.is_empty() {
            let _ = writeln!(out, "- {}: {}", x.name, notes.join("; "));
        }
    }

    if s.iter()
        .any(|x| x.graph_level.as_ref().is_some_and(|g| !g.calls.is_empty()))
    {
        out.push_str("\n## Host calls between steps (graph-level trace)\n\n");
        out.push_str(
            "CUDA runtime calls in the gap from a step's end to the next step's start: calls and \
             µs a gap (means; a call that began before the gap counts from its start).\n\n",
        );
        let mut cols = vec!["call".to_owned()];
        for n in &names {
            cols.push(format!("{n} calls"));
            cols.push(format!("{n} µs"));
        }
        out.push_str(&header(&cols, cols.len() - 1));
        let mut order: Vec<String> = Vec::new();
        for x in s {
            for c in x.graph_level.iter().flat_map(|g| &g.calls) {
                if !order.contains(&c.0) {
                    order.push(c.0.clone());
                }
            }
        }
        for name in order {
            let mut cells = vec![format!("`{name}`")];
            for x in s {
                match x
                    .graph_level
                    .as_ref()
                    .and_then(|g| g.calls.iter().find(|c| c.0 == name))
                {
                    Some(c) => {
                        cells.push(format!("{:.2}", c.1));
                        cells.push(format!("{:.1}", c.2));
                    }
                    None => cells.extend(["-".to_owned(), "-".to_owned()]),
                }
            }
            out.push_str(&row(cells));
        }
    }

    out.push_str("\n## Kernel families, per step\n\n");
    out.push_str(
        "Exclusive µs: each kernel from the later of its start and the end of everything before \
         it, so the column sums to the busy time. Memcpy and memset nodes in brackets.\n\n",
    );
    let mut cols = vec!["family".to_owned(), "window".to_owned()];
    for n in &names {
        for what in ["launches", "µs", "share", "µs each"] {
            cols.push(format!("{n} {what}"));
        }
    }
    for n in names.iter().skip(1) {
        cols.push(format!("Δ µs {n}"));
    }
    out.push_str(&header(&cols, cols.len() - 2));
    for family in family_order(p) {
        let window = s
            .iter()
            .find_map(|x| find(x, &family).and_then(|f| f.window.clone()))
            .unwrap_or_default();
        let mut cells = vec![format!("`{family}`"), window];
        for x in s {
            match find(x, &family) {
                Some(f) => cells.extend([
                    count(f.launches),
                    format!("{:.1}", f.exclusive_us),
                    pct(f.share),
                    format!("{:.2}", f.us_each),
                ]),
                None => cells.extend(["-", "-", "-", "-"].map(String::from)),
            }
        }
        let us = |x: &SettingProfile| find(x, &family).map_or(0.0, |f| f.exclusive_us);
        for x in s.iter().skip(1) {
            cells.push(format!("{:+.1}", us(x) - us(&s[0])));
        }
        out.push_str(&row(cells));
    }
    let mut cells = vec!["**busy**".to_owned(), String::new()];
    for x in s {
        let launches: f64 = x.families.iter().map(|f| f.launches).sum();
        cells.extend([
            count(launches),
            format!("{:.1}", x.busy_us),
            "100%".into(),
            String::new(),
        ]);
    }
    for x in s.iter().skip(1) {
        cells.push(format!("{:+.1}", x.busy_us - s[0].busy_us));
    }
    out.push_str(&row(cells));

    out.push_str("\n## Weight reads, per step\n\n");
    out.push_str(
        "Matvec launches attributed to the tensors they read (from the grid and the GGUF's \
         shapes, or the overlay's launch log; `cargo xtask profile --help`); TB/s over their \
         exclusive time, against the measured read bandwidth; µs a launch and, in brackets, the \
         decode GEMV budget: bytes / (0.6 × read bandwidth) + 1.5 µs. The **all** rows: every \
         launch of the kernel, TB/s over the attributed ones.\n\n",
    );
    let mut cols = vec!["weights".to_owned(), "kernel".to_owned()];
    for n in &names {
        for what in [
            "launches",
            "MB",
            "µs",
            "TB/s",
            "of read BW",
            "µs each (budget)",
        ] {
            cols.push(format!("{n} {what}"));
        }
    }
    out.push_str(&header(&cols, cols.len() - 2));
    let mut keys: Vec<(String, String, f64)> = Vec::new();
    for x in s {
        for w in &x.weights {
            match keys
                .iter_mut()
                .find(|k| k.0 == w.weights && k.1 == w.family)
            {
                Some(k) => k.2 = k.2.max(w.exclusive_us),
                None => keys.push((w.weights.clone(), w.family.clone(), w.exclusive_us)),
            }
        }
    }
    keys.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (weights, family, _) in &keys {
        let mut cells = vec![weights.clone(), format!("`{family}`")];
        for x in s {
            match x
                .weights
                .iter()
                .find(|w| &w.weights == weights && &w.family == family)
            {
                Some(w) => cells.extend([
                    count(w.launches),
                    format!("{:.1}", w.bytes / 1e6),
                    format!("{:.1}", w.exclusive_us),
                    opt(Some(w.tbps), |v| format!("{v:.2}")),
                    opt(Some(w.read_share), pct),
                    format!(
                        "{:.2} ({:.2})",
                        w.exclusive_us / w.launches,
                        gemv_budget_us(w.bytes / w.launches, p.bandwidth.read_tbps)
                    ),
                ]),
                None => cells.extend(["-", "-", "-", "-", "-", "-"].map(String::from)),
            }
        }
        out.push_str(&row(cells));
    }
    // Per weight-reading family: all its launches and time, TB/s over the attributed ones.
    for family in family_order(p) {
        let stats: Vec<Option<&FamilyStats>> = s
            .iter()
            .map(|x| find(x, &family).filter(|f| f.bytes.is_some()))
            .collect();
        if stats.iter().all(Option::is_none) {
            continue;
        }
        let mut cells = vec!["**all**".to_owned(), format!("`{family}`")];
        for f in stats {
            match f {
                Some(f) => cells.extend([
                    count(f.launches),
                    format!("{:.1}", f.bytes.unwrap_or(0.0) / 1e6),
                    format!("{:.1}", f.exclusive_us),
                    opt(f.tbps, |v| format!("{v:.2}")),
                    opt(f.read_share, pct),
                    "-".to_owned(),
                ]),
                None => cells.extend(["-", "-", "-", "-", "-", "-"].map(String::from)),
            }
        }
        out.push_str(&row(cells));
    }
    let unattributed: Vec<String> = s
        .iter()
        .flat_map(|x| {
            x.unattributed.iter().map(move |u| {
                format!(
                    "- {}: `{}` grid {:?} block {:?}, {} per step: {}",
                    x.name,
                    u.family,
                    u.grid,
                    u.block,
                    count(u.launches),
                    u.reason
                )
            })
        })
        .collect();
    if unattributed.is_empty() {
        out.push_str("\nEvery matvec launch was attributed.\n");
    } else {
        out.push_str("\nNot attributed (their bytes are missing above):\n\n");
        for u in unattributed {
            out.push_str(&u);
            out.push('\n');
        }
    }

    let mut window_rows: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (i, x) in s.iter().enumerate() {
        for f in &x.families {
            if let Some(w) = &f.window {
                let cells = window_rows
                    .entry(w.clone())
                    .or_insert_with(|| vec![(0.0, 0.0); s.len()]);
                cells[i].0 += f.launches;
                cells[i].1 += f.exclusive_us;
            }
        }
    }
    if !window_rows.is_empty() {
        out.push_str("\n## Overlay windows, per step\n\n");
        let mut cols = vec!["window".to_owned()];
        for n in &names {
            cols.push(format!("{n} launches"));
            cols.push(format!("{n} µs"));
        }
        out.push_str(&header(&cols, cols.len() - 1));
        for (window, cells) in window_rows {
            let mut line = vec![window];
            for (launches, us) in cells {
                line.push(count(launches));
                line.push(format!("{us:.1}"));
            }
            out.push_str(&row(line));
        }
    }

    out.push_str(
        "\n## How\n\n\
         llama-bench `-ngl 99 -fa 1 -p 0 -n <tokens>` (and `-d <depth>` at a depth: its prompt \
         runs outside CUDA graphs, so no step counts it), each setting in its own process: once \
         without tracing (tok/s), once under bench/tools/cupti-trace.cpp (loaded through \
         `CUDA_INJECTION64_PATH`), which records every kernel, memcpy and memset. A step is one \
         CUDA graph launch (its kernels carry the launch's correlation id); the steady steps \
         have the most common kernel count, less the first (a cold replay). Numbers are means \
         over the steady steps. The graph-level rows come from a third run under the same \
         library with `FRT_CUPTI_LEVEL=graphs`: one record a graph launch, the copies and the \
         CUDA runtime calls, no kernel records, so the step's GPU span is as untraced; the \
         runtime calls' records still slow the host a little (~160 calls a step), so its gaps \
         are upper bounds. Medians over its launches after the first.\n",
    );
    out
}

// ---- SVG ----

const BAR_COLOURS: [&str; 4] = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"];
/// Families drawn; the rest are summed in one group.
const SVG_FAMILIES: usize = 18;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The smallest of 1, 2, 5 × 10^k at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// A horizontal bar chart of exclusive µs per step, one group per family, one bar per setting.
pub fn svg(p: &Profile) -> String {
    let order = family_order(p);
    let mut groups: Vec<(String, Vec<f64>)> = order
        .iter()
        .take(SVG_FAMILIES)
        .map(|family| {
            let values = p
                .settings
                .iter()
                .map(|s| find(s, family).map_or(0.0, |f| f.exclusive_us))
                .collect();
            let window = p
                .settings
                .iter()
                .find_map(|s| find(s, family).and_then(|f| f.window.clone()));
            let label = match window {
                Some(w) => format!("{family} [{w}]"),
                None => family.clone(),
            };
            (label, values)
        })
        .collect();
    if order.len() > SVG_FAMILIES {
        let rest = &order[SVG_FAMILIES..];
        let values = p
            .settings
            .iter()
            .map(|s| {
                rest.iter()
                    .filter_map(|family| find(s, family))
                    .map(|f| f.exclusive_us)
                    .sum()
            })
            .collect();
        groups.push((format!("{} other families", rest.len()), values));
    }
    let settings = p.settings.len().max(1);
    let (label_w, bar_w, right_w) = (330.0, 520.0, 80.0);
    let (bar_h, bar_gap, group_gap, top) = (12.0, 2.0, 10.0, 78.0);
    let group_h = settings as f64 * (bar_h + bar_gap) + group_gap;
    let plot_h = groups.len() as f64 * group_h;
    let width = label_w + bar_w + right_w;
    let height = top + plot_h + 40.0;
    let largest = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max);
    let step = nice_step(largest / 5.0);
    let axis_max = (largest / step).ceil().max(1.0) * step;
    let x = |v: f64| label_w + v / axis_max * bar_w;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r##"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#,
        escape(&format!(
            "Exclusive µs per decode step by kernel family: {}, {}, commit {}",
            p.gpu,
            test_name(p.tokens, p.depth),
            p.commit
        ))
    );
    for (i, s) in p.settings.iter().enumerate() {
        let lx = 10.0 + i as f64 * 250.0;
        let _ = writeln!(
            out,
            r#"<rect x="{lx:.0}" y="38" width="12" height="12" fill="{}"/><text x="{:.0}" y="48">{}</text>"#,
            BAR_COLOURS[i % BAR_COLOURS.len()],
            lx + 17.0,
            escape(&format!("{} ({:.1} µs busy)", s.name, s.busy_us))
        );
    }
    let mut tick = 0.0;
    while tick <= axis_max * (1.0 + 1e-9) {
        let tx = x(tick);
        let _ = writeln!(
            out,
            r##"<line x1="{tx:.1}" y1="{top:.0}" x2="{tx:.1}" y2="{:.0}" stroke="#dddddd"/><text x="{tx:.1}" y="{:.0}" text-anchor="middle">{}</text>"##,
            top + plot_h,
            top + plot_h + 16.0,
            count(tick)
        );
        tick += step;
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.0}" y="{:.0}" text-anchor="middle">µs per step</text>"#,
        label_w + bar_w / 2.0,
        top + plot_h + 32.0
    );
    for (g, (family, values)) in groups.iter().enumerate() {
        let gy = top + g as f64 * group_h;
        let label: String = if family.chars().count() > 48 {
            family.chars().take(47).chain(['…']).collect()
        } else {
            family.clone()
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.0}" y="{:.1}" text-anchor="end">{}</text>"#,
            label_w - 8.0,
            gy + (group_h - group_gap) / 2.0 + 4.0,
            escape(&label)
        );
        for (i, v) in values.iter().enumerate() {
            let by = gy + i as f64 * (bar_h + bar_gap);
            let _ = writeln!(
                out,
                r#"<rect class="bar" x="{label_w:.0}" y="{by:.1}" width="{:.1}" height="{bar_h:.0}" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="10">{v:.1}</text>"#,
                x(*v) - label_w,
                BAR_COLOURS[i % BAR_COLOURS.len()],
                x(*v) + 4.0,
                by + bar_h - 2.0
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::trace::tests::text;

    const MMVQ_Q4K: &str = "_ZL13mul_mat_vec_qIL9ggml_type12ELi1ELb0ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args_devicePfj5uint3jjjS7_jjjS7_jjjj";

    fn windows() -> WindowKernels {
        WindowKernels::parse("GDN_GATED_NORM = [\"frt_gated_rms_norm\"]\n").unwrap()
    }

    fn tensors() -> Vec<WeightTensor> {
        vec![WeightTensor {
            name: "blk.0.attn_qkv.weight".into(),
            ggml_type: 12,
            dims: vec![2048, 8192],
        }]
    }

    /// Steps: an eager kernel; a warm-up launch of 2 kernels; four launches of 3 kernels
    /// (matvec, norm overlapping it under PDL, the window's kernel) and a memset; times in ns.
    fn trace_text() -> String {
        let mut lines = vec![
            "n 0 _Z12rms_norm_f32ILi256ELb1ELb0ELb0EEvPKfPfil".to_owned(),
            format!("n 1 {MMVQ_Q4K}"),
            "n 2 _ZL29frt_gated_rms_norm_f32_kernel23frt_gated_rms_norm_args".to_owned(),
            "k 0 0 1000 0 7 1 0 1 1 1 256 1 1".to_owned(),
            "k 0 2000 3000 0 7 2 5 1 1 1 256 1 1".to_owned(),
            "k 1 3000 9000 0 7 2 5 8192 1 1 32 4 1".to_owned(),
        ];
        for step in 0..4u64 {
            let t0 = 10_000 + step * 20_000;
            let c = 3 + step;
            lines.extend([
                // matvec 0–10 µs; the norm starts at 8 (PDL) and ends at 12; the window's
                // kernel 13–14; a memset 14–14.5 µs. Busy 14.5 of the 14.5 µs span, idle 1 µs
                // between 12 and 13: 13.5 busy.
                format!("k 1 {} {} 0 7 {c} 5 8192 1 1 32 4 1", t0, t0 + 10_000),
                format!("k 0 {} {} 0 7 {c} 5 1 1 1 256 1 1", t0 + 8_000, t0 + 12_000),
                format!(
                    "k 2 {} {} 0 7 {c} 5 32 1 1 32 1 1",
                    t0 + 13_000,
                    t0 + 14_000
                ),
                format!("s 64 {} {} 0 7 {c} 5", t0 + 14_000, t0 + 14_500),
            ]);
        }
        lines.push("e".into());
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        text(&refs)
    }

    fn run(name: &str) -> SettingRun {
        SettingRun {
            name: name.into(),
            env: Vec::new(),
            unprofiled_ts: vec![240.0, 250.0, 245.0],
            profiled_ts: vec![160.0],
            trace: format!("{name}.trace"),
            launch_log: None,
            graph_trace: None,
            graph_ts: Vec::new(),
            periods: None,
        }
    }

    #[test]
    fn the_gemv_windows_kernels_get_their_bytes_from_the_launch_log() {
        // Four graph launches of two GEMV window kernels each: 0–5 µs and 5–7 µs.
        let mut lines =
            vec!["n 0 _ZL25frt_gemv_registers_kernelILi3ELi1EEv11gemv_params".to_owned()];
        for step in 0..4u64 {
            let t0 = step * 20_000;
            let c = 3 + step;
            lines.push(format!(
                "k 0 {} {} 0 7 {c} 5 264 1 1 256 1 1",
                t0,
                t0 + 5_000
            ));
            lines.push(format!(
                "k 0 {} {} 0 7 {c} 5 264 1 1 256 1 1",
                t0 + 5_000,
                t0 + 7_000
            ));
        }
        lines.push("e".into());
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let trace = trace::parse(&text(&refs)).unwrap();
        // A warm-up pass of one launch, then the capture the steps replay.
        let log =
            "1\tHEAD\t99\toutput\n4\tINPROJ\t10000\tattn_qkv / attn_gate\n4\tHEAD\t4000\toutput\n";
        let passes = launch_log::parse(log).unwrap();
        let p =
            analyse_setting(&run("overlay"), &trace, Some(&passes), &[], &windows(), 4.0).unwrap();
        assert!(p.unattributed.is_empty(), "{:?}", p.unattributed);
        let w = |roles: &str| p.weights.iter().find(|w| w.weights == roles).unwrap();
        assert_eq!(
            (
                w("attn_qkv / attn_gate").bytes,
                w("attn_qkv / attn_gate").exclusive_us
            ),
            (10000.0, 5.0)
        );
        assert!((w("attn_qkv / attn_gate").tbps - 10000.0 / 5e3 / 1e3).abs() < 1e-12);
        assert_eq!((w("output").bytes, w("output").exclusive_us), (4000.0, 2.0));
        assert_eq!(p.weight_bytes, 14000.0);
        let family = &p.families[0];
        assert_eq!(
            (family.family.as_str(), family.bytes),
            ("frt_gemv_registers_kernel", Some(14000.0))
        );

        // No log, or none with the step's two launches: listed with the reason.
        let p = analyse_setting(&run("overlay"), &trace, None, &[], &windows(), 4.0).unwrap();
        assert!(
            p.unattributed[0].reason.contains("GGML_FLASHRT_LAUNCH_LOG"),
            "{:?}",
            p.unattributed
        );
        assert_eq!(p.unattributed[0].launches, 2.0);
        let warmup_only = launch_log::parse("1\tHEAD\t99\toutput\n").unwrap();
        let p = analyse_setting(
            &run("overlay"),
            &trace,
            Some(&warmup_only),
            &[],
            &windows(),
            4.0,
        )
        .unwrap();
        assert!(
            p.unattributed[0].reason.contains("2 launches"),
            "{:?}",
            p.unattributed
        );
        assert_eq!(p.weight_bytes, 0.0);
    }

    #[test]
    fn a_setting_is_profiled_per_steady_step() {
        let trace = trace::parse(&trace_text()).unwrap();
        let p =
            analyse_setting(&run("overlay"), &trace, None, &tensors(), &windows(), 4.0).unwrap();
        assert_eq!(
            (
                p.graph_launches,
                p.outside_graphs,
                p.steady_steps,
                p.kernels_per_step
            ),
            (5, 1, 3, 3)
        );
        assert_eq!(p.other_steps, [(2, 1)]);
        assert_eq!((p.unprofiled_ts, p.profiled_ts), (245.0, 160.0));
        assert!((p.span_us - 14.5).abs() < 1e-9, "{}", p.span_us);
        assert!((p.busy_us - 13.5).abs() < 1e-9, "{}", p.busy_us);
        assert!((p.idle_us - 1.0).abs() < 1e-9);
        assert_eq!(p.period_us, Some(20.0));
        let fam = |name: &str| p.families.iter().find(|f| f.family == name).unwrap();
        let mmvq = fam("mul_mat_vec_q");
        assert_eq!((mmvq.launches, mmvq.exclusive_us), (1.0, 10.0));
        // 8192 rows × 8 Q4_K blocks × 144 bytes in 10 µs.
        let bytes = 8192.0 * 8.0 * 144.0;
        assert_eq!(mmvq.bytes, Some(bytes));
        assert!((mmvq.tbps.unwrap() - bytes / 10e3 / 1e3).abs() < 1e-12);
        assert!((mmvq.read_share.unwrap() - mmvq.tbps.unwrap() / 4.0).abs() < 1e-12);
        // The norm only counts from the matvec's end.
        assert_eq!(fam("rms_norm_f32").exclusive_us, 2.0);
        assert!((fam("rms_norm_f32").share - 2.0 / 13.5).abs() < 1e-12);
        let window = fam("frt_gated_rms_norm_f32_kernel");
        assert_eq!(window.window.as_deref(), Some("GDN_GATED_NORM"));
        assert_eq!(fam("[memset]").exclusive_us, 0.5);
        let sum: f64 = p.families.iter().map(|f| f.exclusive_us).sum();
        assert!((sum - p.busy_us).abs() < 1e-9);
        // Sorted by exclusive time.
        assert_eq!(p.families[0].family, "mul_mat_vec_q");
        assert_eq!(p.weights.len(), 1);
        assert_eq!(p.weights[0].weights, "attn_qkv");
        assert_eq!((p.weight_bytes, p.weight_us), (bytes, 10.0));
        assert!(p.unattributed.is_empty());

        // Without the tensor, the launches are listed with the reason.
        let p = analyse_setting(&run("stock"), &trace, None, &[], &windows(), 4.0).unwrap();
        assert_eq!(p.unattributed.len(), 1);
        assert_eq!(p.unattributed[0].launches, 1.0);
        assert!(p.unattributed[0]
            .reason
            .contains("no Q4_K weights with 8192 rows"));
        assert_eq!(p.weight_bytes, 0.0);
    }

    fn profile() -> Profile {
        let trace = trace::parse(&trace_text()).unwrap();
        let mut stock =
            analyse_setting(&run("stock"), &trace, None, &tensors(), &windows(), 4.0).unwrap();
        // Stock has no window kernel and a slower matvec: 11 µs of 14.5 busy.
        stock.families.retain(|f| f.window.is_none());
        let mmvq = &mut stock.families[0];
        (mmvq.exclusive_us, mmvq.us_each, mmvq.share) = (11.0, 11.0, 11.0 / 14.5);
        stock.busy_us = 14.5;
        let mut overlay =
            analyse_setting(&run("overlay"), &trace, None, &tensors(), &windows(), 4.0).unwrap();
        overlay.graph_ts = Some(300.0);
        overlay.periods = Some(super::super::periods::Periods {
            reps: 3,
            median_us: 2600.0,
            mean_us: 2700.0,
            node_loop_calls: 2.0,
            long: 1.0,
            long_excess_us: 80.0,
            first_us: vec![5000.0, 2600.0],
        });
        stock.periods_missing = Some("a build without GGML_FLASHRT_PERIODS?".into());
        overlay.graph_level = Some(trace::GraphTimes {
            launches: 4,
            span_us: 7.0,
            period_us: 10.0,
            mean_period_us: 12.5,
            gap_us: 2.5,
            long_gaps: vec![(3, 13.0)],
            long_gaps_us: 2.5,
            copies_us: 1.0,
            sync_returned_us: Some(0.4),
            launch_called_us: Some(1.25),
            launch_call_us: Some(0.3),
            launch_to_start_us: Some(1.25),
            calls: vec![("cudaGraphLaunch_v10000".into(), 1.0, 0.3)],
        });
        Profile {
            date: "2026-11-30".into(),
            commit: "abc1234".into(),
            gpu: "NVIDIA H200".into(),
            model: "/m/qwen36 <a&b>.gguf".into(),
            command: "cargo xtask profile".into(),
            switches: vec![("GGML_FLASHRT_X".into(), "0".into())],
            tokens: 64,
            depth: 0,
            bytes_per_token: 1.967e9,
            bandwidth: Bandwidth {
                gpu: "NVIDIA H200".into(),
                read_tbps: 4.0,
                copy_tbps: 3.9,
            },
            settings: vec![stock, overlay],
        }
    }

    #[test]
    fn the_markdown_puts_the_settings_side_by_side() {
        let md = markdown(&profile());
        assert!(
            md.starts_with("# Decode profile: NVIDIA H200, qwen36 <a&b>.gguf\n"),
            "{md}"
        );
        assert!(md.contains("floor 492 µs"), "{md}");
        assert!(md.contains(" · tg64 · "), "{md}");
        // At a depth, the header and the chart name the test as bench does.
        let deep = Profile {
            depth: 8192,
            ..profile()
        };
        assert!(markdown(&deep).contains(" · tg64@d8192 · "));
        assert!(svg(&deep).contains("NVIDIA H200, tg64@d8192, commit abc1234"));
        assert!(
            md.contains("Switches in the environment of every run: `GGML_FLASHRT_X=0`\n"),
            "{md}"
        );
        assert!(
            md.contains("| tok/s without tracing | 245.0 | 245.0 |"),
            "{md}"
        );
        assert!(md.contains("| kernels per step | 3 | 3 |"), "{md}");
        assert!(
            md.contains("| untraced: mean step period µs (what tok/s pays) | - | 2700.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| untraced: a run's first steps µs | - | 5000 / 2600 |"),
            "{md}"
        );
        assert!(
            md.contains("no untraced periods: a build without GGML_FLASHRT_PERIODS?"),
            "{md}"
        );
        // Graph-level rows: "-" for a setting without a graph-level trace.
        assert!(
            md.contains("| graph-level: between steps µs (host work, copies) | - | 2.5 |"),
            "{md}"
        );
        assert!(
            md.contains("| tok/s traced at graph level (one record a graph launch) | - | 300.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| graph-level: cudaGraphLaunch call µs | - | 0.3 |"),
            "{md}"
        );
        assert!(
            md.contains("| graph-level: gaps over twice the median, and their excess µs a step | - | 1, 2.5 |"),
            "{md}"
        );
        assert!(
            md.contains("| `cudaGraphLaunch_v10000` | - | - | 1.00 | 0.3 |"),
            "{md}"
        );
        assert!(md.contains("| GPU busy µs | 14.5 | 13.5 |"), "{md}");
        assert!(
            md.contains("| steady steps (of graph launches) | 3 of 5 | 3 of 5 |"),
            "{md}"
        );
        // family, window, then stock's and the overlay's launches, µs, share, µs each, and Δ.
        assert!(
            md.contains("| `mul_mat_vec_q` |  | 1 | 11.0 | 75.9% | 11.00 | 1 | 10.0 | 74.1% | 10.00 | -1.0 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| `frt_gated_rms_norm_f32_kernel` | GDN_GATED_NORM | - | - | - | - | 1 | 1.0 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| **busy** |  | 3 | 14.5 | 100% |  | 4 | 13.5 | 100% |  | -1.0 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| attn_qkv | `mul_mat_vec_q` | 1 | 9.4 | 10.0 | 0.94 | 23.6% | 10.00 (5.43) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| GDN_GATED_NORM | 0 | 0.0 | 1 | 1.0 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| **all** | `mul_mat_vec_q` | 1 | 9.4 | 11.0 | 0.94 | 23.6% | - | 1 | 9.4 | 10.0 |"
            ),
            "{md}"
        );
        assert!(md.contains("left out: 1 × 2 kernels"), "{md}");
        assert!(
            md.contains("graph-level long gaps: 13 µs after steady launch 4"),
            "{md}"
        );
        assert!(md.contains("Every matvec launch was attributed."));
        // Every table row has as many cells as its header.
        for table in md.split("\n\n").filter(|b| b.starts_with('|')) {
            let widths: Vec<usize> = table.lines().map(|l| l.matches('|').count()).collect();
            assert!(widths.iter().all(|&w| w == widths[0]), "{table}");
        }
    }

    #[test]
    fn the_svg_draws_one_bar_per_family_and_setting_to_scale() {
        let p = profile();
        let svg = svg(&p);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        let families = family_order(&p).len();
        assert_eq!(svg.matches(r#"<rect class="bar""#).count(), families * 2);
        // The largest value, 11 µs, on an axis to 15 (ticks of 5): 11/15 of 520 px.
        let widths: Vec<f64> = svg
            .match_indices(r#"class="bar""#)
            .map(|(i, _)| {
                let rest = &svg[i..];
                let w = rest.split("width=\"").nth(1).unwrap();
                w.split('"').next().unwrap().parse().unwrap()
            })
            .collect();
        let widest = widths.iter().copied().fold(0.0, f64::max);
        assert!((widest - 11.0 / 15.0 * 520.0).abs() < 0.1, "{widest}");
        assert!(svg.contains(">stock (14.5 µs busy)<"), "{svg}");
        assert!(
            svg.contains(">frt_gated_rms_norm_f32_kernel [GDN_GATED_NORM]<"),
            "{svg}"
        );
        // Text is escaped.
        let mut odd = profile();
        odd.settings[0].families[0].family = "k<a&b>".into();
        assert!(svg_contains_escaped(&super::svg(&odd)));
    }

    fn svg_contains_escaped(svg: &str) -> bool {
        svg.contains(">k&lt;a&amp;b&gt;<") && !svg.contains("k<a&b>")
    }

    #[test]
    fn axis_steps_are_one_two_or_five() {
        assert_eq!(nice_step(0.8), 1.0);
        assert_eq!(nice_step(1.2), 2.0);
        assert_eq!(nice_step(2.2), 5.0);
        assert_eq!(nice_step(370.0), 500.0);
        assert_eq!(nice_step(500.0), 500.0);
        assert_eq!(nice_step(0.0), 1.0);
    }
}
