//! The traces bench/tools/cupti-trace.cpp writes (its header comment gives the format), cut into
//! decode steps, and the exclusive-time accounting of overlapping kernels.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

const HEADER: &str = "# flashrt-cupti-trace 1";

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Kernel {
        /// Index into [`Trace::names`].
        name: usize,
        grid: [u32; 3],
        block: [u32; 3],
    },
    Memcpy {
        /// HtoD, DtoH, DtoD, HtoH, PtoP or other.
        direction: &'static str,
        bytes: u64,
    },
    Memset {
        bytes: u64,
    },
    /// A whole CUDA graph launch, first node's start to last node's end (a graph-level trace,
    /// FRT_CUPTI_LEVEL=graphs, has these instead of the graph's kernels).
    Graph,
    /// A CUDA runtime call on the host (graph-level traces).
    Api {
        /// Index into [`Trace::names`].
        name: usize,
        thread: u32,
    },
}

/// One thing the GPU ran. Times in ns on CUPTI's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub activity: Activity,
    pub start: u64,
    pub end: u64,
    pub device: u32,
    pub stream: u32,
    /// The launching API call's; for a graph's work, the cudaGraphLaunch's.
    pub correlation: u32,
    /// The CUDA graph the work ran in; 0 outside graphs.
    pub graph: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Kernel names, mangled.
    pub names: Vec<String>,
    pub records: Vec<Record>,
    /// Records CUPTI could not deliver (its buffers were full).
    pub dropped: u64,
}

const DIRECTIONS: [&str; 6] = ["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "other"];

/// Parses a whole trace. A trace without its end marker is an error: the traced process did not
/// exit normally, or CUPTI did not deliver every record.
pub fn parse(text: &str) -> Result<Trace> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, HEADER)) => {}
        Some((_, first)) if first.starts_with("# flashrt-cupti-trace") => {
            bail!("trace format {first:?}; this xtask reads {HEADER:?}: rebuild the injection library")
        }
        _ => bail!("not a flashrt-cupti-trace file (no {HEADER:?} line)"),
    }
    let mut trace = Trace {
        names: Vec::new(),
        records: Vec::new(),
        dropped: 0,
    };
    let mut ended = false;
    for (index, line) in lines {
        let at = || format!("trace line {}: {line:?}", index + 1);
        if ended {
            bail!("{}: after the end marker", at());
        }
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        match tag {
            "n" => {
                let (id, name) = rest.split_once(' ').with_context(at)?;
                let id: usize = id.parse().with_context(at)?;
                if id != trace.names.len() || name.is_empty() {
                    bail!("{}: name {id} out of order", at());
                }
                trace.names.push(name.to_owned());
            }
            "k" | "m" | "s" | "g" | "a" => {
                let record = parse_record(tag, rest, trace.names.len()).with_context(at)?;
                trace.records.push(record);
            }
            "d" => trace.dropped += rest.parse::<u64>().with_context(at)?,
            "e" => ended = true,
            _ => bail!("{}: unknown record", at()),
        }
    }
    if !ended {
        bail!(
            "the trace has no end marker: the traced run did not exit normally or CUPTI did not \
             deliver every record (see the run's stderr for flashrt-cupti-trace lines)"
        );
    }
    Ok(trace)
}

fn parse_record(tag: &str, rest: &str, names: usize) -> Result<Record> {
    let fields: Vec<&str> = rest.split(' ').collect();
    let int = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .with_context(|| format!("field {} missing", i + 1))?
            .parse::<u64>()
            .with_context(|| format!("field {} is not a number", i + 1))
    };
    let small = |i: usize| -> Result<u32> {
        u32::try_from(int(i)?).with_context(|| format!("field {} is out of range", i + 1))
    };
    let (activity, first_time) = match tag {
        "k" => {
            if fields.len() != 13 {
                bail!("a kernel record has 13 fields, this one {}", fields.len());
            }
            let name = usize::try_from(int(0)?)?;
            if name >= names {
                bail!("kernel name {name} was not defined");
            }
            (
                Activity::Kernel {
                    name,
                    grid: [small(7)?, small(8)?, small(9)?],
                    block: [small(10)?, small(11)?, small(12)?],
                },
                1,
            )
        }
        "m" => {
            if fields.len() != 8 {
                bail!("a memcpy record has 8 fields, this one {}", fields.len());
            }
            let direction = DIRECTIONS
                .iter()
                .find(|d| **d == fields[0])
                .copied()
                .unwrap_or("other");
            (
                Activity::Memcpy {
                    direction,
                    bytes: int(1)?,
                },
                2,
            )
        }
        "a" => {
            if fields.len() != 5 {
                bail!(
                    "a runtime call record has 5 fields, this one {}",
                    fields.len()
                );
            }
            let name = usize::try_from(int(0)?)?;
            if name >= names {
                bail!("call name {name} was not defined");
            }
            let record = Record {
                activity: Activity::Api {
                    name,
                    thread: small(3)?,
                },
                start: int(1)?,
                end: int(2)?,
                device: 0,
                stream: 0,
                correlation: small(4)?,
                graph: 0,
            };
            if record.end < record.start {
                bail!("ends before it starts");
            }
            return Ok(record);
        }
        "g" => {
            if fields.len() != 6 {
                bail!("a graph record has 6 fields, this one {}", fields.len());
            }
            (Activity::Graph, 0)
        }
        _ => {
            if fields.len() != 7 {
                bail!("a memset record has 7 fields, this one {}", fields.len());
            }
            (Activity::Memset { bytes: int(0)? }, 1)
        }
    };
    let record = Record {
        activity,
        start: int(first_time)?,
        end: int(first_time + 1)?,
        device: small(first_time + 2)?,
        stream: small(first_time + 3)?,
        correlation: small(first_time + 4)?,
        graph: small(first_time + 5)?,
    };
    if record.end < record.start {
        bail!("ends before it starts");
    }
    Ok(record)
}

/// One replay of a CUDA graph: a decode step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The cudaGraphLaunch's correlation id.
    pub correlation: u32,
    /// Indices into [`Trace::records`], by start time.
    pub records: Vec<usize>,
    pub kernels: usize,
    pub start: u64,
    pub end: u64,
}

/// The trace's graph launches in time order, and how many records ran outside any graph
/// (ggml-cuda's eager warm-up, input and output copies).
pub fn graph_steps(trace: &Trace) -> (Vec<Step>, usize) {
    let mut launches: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    let mut outside = 0;
    for (i, record) in trace.records.iter().enumerate() {
        if record.graph == 0 {
            outside += 1;
        } else {
            launches.entry(record.correlation).or_default().push(i);
        }
    }
    let mut steps: Vec<Step> = launches
        .into_iter()
        .map(|(correlation, mut records)| {
            let r = &trace.records;
            records.sort_by_key(|&i| (r[i].start, r[i].end));
            Step {
                correlation,
                kernels: records
                    .iter()
                    .filter(|&&i| matches!(r[i].activity, Activity::Kernel { .. }))
                    .count(),
                start: records.iter().map(|&i| r[i].start).min().unwrap_or(0),
                end: records.iter().map(|&i| r[i].end).max().unwrap_or(0),
                records,
            }
        })
        .collect();
    steps.sort_by_key(|s| (s.start, s.correlation));
    (steps, outside)
}

/// A graph-level trace's decode steps: medians over the graph launches after the first (a cold
/// replay), in µs. The period is start to next start; the gap, this launch's end to the next one's
/// start, is what the GPU waits for the host (llama_decode's own work, the graph's launch) and for
/// the copies outside the graph; copies_us is those copies' part. The host's side of a gap, from
/// the runtime calls in it: when the synchronize waiting for the step returned, when the next
/// cudaGraphLaunch was called and how long the call took, from that call to the GPU's start, and
/// every call made in a gap (name, calls and µs a gap, means). tok/s pays the mean period, not
/// the median: the gaps over twice the median (eager steps and captures at a run's start, stalls)
/// are counted, with their excess over the median gap averaged over every step.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GraphTimes {
    pub launches: usize,
    pub span_us: f64,
    pub period_us: f64,
    pub mean_period_us: f64,
    pub gap_us: f64,
    /// The long gaps: after which steady launch (0 the first), and how long.
    pub long_gaps: Vec<(usize, f64)>,
    pub long_gaps_us: f64,
    pub copies_us: f64,
    pub sync_returned_us: Option<f64>,
    pub launch_called_us: Option<f64>,
    pub launch_call_us: Option<f64>,
    pub launch_to_start_us: Option<f64>,
    pub calls: Vec<(String, f64, f64)>,
}

pub fn graph_times(trace: &Trace) -> Result<GraphTimes> {
    let mut launches: Vec<&Record> = trace
        .records
        .iter()
        .filter(|r| r.activity == Activity::Graph)
        .collect();
    launches.sort_by_key(|r| (r.start, r.end));
    if launches.len() < 3 {
        bail!(
            "{} graph launches in the graph-level trace, 3 at least needed: did the run decode \
             through CUDA graphs?",
            launches.len()
        );
    }
    let copies: Vec<&Record> = trace
        .records
        .iter()
        .filter(|r| {
            r.graph == 0
                && matches!(
                    r.activity,
                    Activity::Memcpy { .. } | Activity::Memset { .. }
                )
        })
        .collect();
    let mut calls: Vec<(&str, &Record)> = trace
        .records
        .iter()
        .filter_map(|r| match r.activity {
            Activity::Api { name, .. } => Some((trace.names[name].as_str(), r)),
            _ => None,
        })
        .collect();
    calls.sort_by_key(|(_, r)| (r.start, r.end));
    let us = |ns: u64| ns as f64 / 1e3;
    let since = |t: u64, from: u64| (t as f64 - from as f64) / 1e3;
    let steady = &launches[1..];
    let spans: Vec<f64> = steady.iter().map(|r| us(r.end - r.start)).collect();
    let (mut periods, mut gaps, mut copied) = (Vec::new(), Vec::new(), Vec::new());
    let (mut synced, mut called, mut call, mut to_start) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut per_name: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for pair in steady.windows(2) {
        let (this, next) = (pair[0], pair[1]);
        periods.push(us(next.start - this.start));
        gaps.push(us(next.start.saturating_sub(this.end)));
        copied.push(us(copies
            .iter()
            .filter(|c| c.start >= this.end && c.end <= next.start)
            .map(|c| c.end - c.start)
            .sum()));
        // The host's calls of this gap: those ending after the step's end that start before the
        // next step does (the synchronize that waited for the step began long before its end).
        let in_gap: Vec<&(&str, &Record)> = calls
            .iter()
            .filter(|(_, c)| c.end > this.end && c.start < next.start)
            .collect();
        for (name, c) in &in_gap {
            let entry = per_name.entry(name).or_default();
            entry.0 += 1;
            entry.1 += c.end.min(next.start) - c.start.max(this.end);
        }
        if let Some((_, sync)) = in_gap.iter().find(|(n, _)| n.contains("Synchronize")) {
            synced.push(since(sync.end, this.end));
        }
        if let Some((_, launch)) = in_gap
            .iter()
            .rev()
            .find(|(n, _)| n.starts_with("cudaGraphLaunch"))
        {
            called.push(since(launch.start, this.end));
            call.push(us(launch.end - launch.start));
            to_start.push(since(next.start, launch.start));
        }
    }
    let gaps_n = steady.len() - 1;
    let median = |v: &[f64]| (!v.is_empty()).then(|| crate::bench::median(v));
    let gap_us = crate::bench::median(&gaps);
    // (gap after the k-th steady launch, µs)
    let long: Vec<(usize, f64)> = gaps
        .iter()
        .enumerate()
        .filter(|(_, &g)| g > 2.0 * gap_us)
        .map(|(k, &g)| (k, g))
        .collect();
    let mut calls: Vec<(String, f64, f64)> = per_name
        .into_iter()
        .map(|(name, (n, ns))| {
            (
                name.to_owned(),
                n as f64 / gaps_n as f64,
                us(ns) / gaps_n as f64,
            )
        })
        .collect();
    calls.sort_by(|a, b| b.2.total_cmp(&a.2));
    Ok(GraphTimes {
        launches: launches.len(),
        span_us: crate::bench::median(&spans),
        period_us: crate::bench::median(&periods),
        mean_period_us: periods.iter().sum::<f64>() / periods.len() as f64,
        gap_us,
        long_gaps_us: long.iter().map(|(_, g)| g - gap_us).sum::<f64>() / gaps_n as f64,
        long_gaps: long,
        copies_us: crate::bench::median(&copied),
        sync_returned_us: median(&synced),
        launch_called_us: median(&called),
        launch_call_us: median(&call),
        launch_to_start_us: median(&to_start),
        calls,
    })
}

/// Which steps are the steady decode steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Steady {
    /// The most common kernel count per step.
    pub kernels_per_step: usize,
    /// Indices into the steps.
    pub steps: Vec<usize>,
    /// Steps with other kernel counts: (kernels, how many steps).
    pub other: Vec<(usize, usize)>,
}

/// The steps whose kernel count is the most common one (ties: the count seen last, the tail),
/// less the first of them: the first replay after a capture runs cold. Prompt and warm-up steps
/// have other counts and are left out.
pub fn steady_steps(steps: &[Step]) -> Result<Steady> {
    if steps.is_empty() {
        bail!(
            "no work ran from a CUDA graph: ggml-cuda evaluated every step eagerly (is \
             GGML_CUDA_DISABLE_GRAPHS set?); profile cuts decode steps at graph launches"
        );
    }
    let mut counts: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        let entry = counts.entry(step.kernels).or_insert((0, 0));
        entry.0 += 1;
        entry.1 = i;
    }
    let (&mode, _) = counts
        .iter()
        .max_by_key(|(_, &(n, last))| (n, last))
        .context("no steps")?;
    let mut chosen: Vec<usize> = (0..steps.len())
        .filter(|&i| steps[i].kernels == mode)
        .collect();
    if chosen.len() >= 3 {
        chosen.remove(0);
    }
    Ok(Steady {
        kernels_per_step: mode,
        steps: chosen,
        other: counts
            .iter()
            .filter(|(&k, _)| k != mode)
            .map(|(&k, &(n, _))| (k, n))
            .collect(),
    })
}

/// The exclusive time of each interval (start, end), in input order: the part of it after every
/// interval that started earlier has ended. Under programmatic dependent launch a kernel starts
/// while its predecessor runs; counted this way the exclusive times sum to the time anything ran
/// (the union of the intervals), and overlap goes to the earlier kernel.
pub fn exclusive(intervals: &[(u64, u64)]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..intervals.len()).collect();
    order.sort_by_key(|&i| intervals[i]);
    let mut out = vec![0; intervals.len()];
    let mut frontier = 0u64;
    for i in order {
        let (start, end) = intervals[i];
        out[i] = end.saturating_sub(start.max(frontier));
        frontier = frontier.max(end);
    }
    out
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A trace in the injection library's format.
    pub fn text(lines: &[&str]) -> String {
        let mut out = format!("{HEADER}\n");
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    #[test]
    fn records_parse_with_their_names_and_the_end_marker() {
        let trace = parse(&text(&[
            "n 0 _Z3fooILi1EEvv",
            "k 0 100 250 0 7 42 3 2048 8 1 32 4 1",
            "m HtoD 64 300 310 0 7 43 0",
            "m weird 8 320 321 0 7 44 0",
            "s 4096 400 405 0 7 42 3",
            "d 2",
            "e",
        ]))
        .unwrap();
        assert_eq!(trace.names, ["_Z3fooILi1EEvv"]);
        assert_eq!(trace.dropped, 2);
        assert_eq!(
            trace.records[0],
            Record {
                activity: Activity::Kernel {
                    name: 0,
                    grid: [2048, 8, 1],
                    block: [32, 4, 1]
                },
                start: 100,
                end: 250,
                device: 0,
                stream: 7,
                correlation: 42,
                graph: 3
            }
        );
        assert_eq!(
            trace.records[1].activity,
            Activity::Memcpy {
                direction: "HtoD",
                bytes: 64
            }
        );
        assert_eq!(
            trace.records[2].activity,
            Activity::Memcpy {
                direction: "other",
                bytes: 8
            }
        );
        assert_eq!(
            (trace.records[3].activity, trace.records[3].graph),
            (Activity::Memset { bytes: 4096 }, 3)
        );
    }

    #[test]
    fn graph_level_traces_give_span_period_and_the_gap_between_launches() {
        // Four launches 10 µs apart, spans 6, 7, 8 and 7 µs; a copy of 1 µs after each of the
        // last three but one, and a copy inside a graph (not counted).
        // The host: a synchronize waiting for each step, returning 0.2 and 0.6 µs after its end,
        // and a graph launch called 1.5 and 2.0 µs after it (0.3 µs calls).
        let trace = parse(&text(&[
            "n 0 cudaStreamSynchronize_v3020",
            "n 1 cudaGraphLaunch_v10000",
            "g 0 9000 0 7 1 4",
            "m HtoD 8 9500 9600 0 7 90 0",
            "g 10000 17000 0 7 2 4",
            "a 0 11000 17200 5 60",
            "m DtoH 4 17500 18500 0 7 91 0",
            "a 1 18500 18800 5 61",
            "g 20000 28000 0 7 3 4",
            "a 0 21000 28600 5 62",
            "m DtoH 4 28500 29500 0 7 92 0",
            "m DtoD 4 20500 21500 0 7 3 4",
            "a 1 29000 29300 5 63",
            "g 30000 37000 0 7 4 4",
            "g 40000 47000 0 7 5 4",
            "g 60000 67000 0 7 6 4",
            "e",
        ]))
        .unwrap();
        assert_eq!(trace.records[0].activity, Activity::Graph);
        assert_eq!(
            trace.records[3].activity,
            Activity::Api { name: 0, thread: 5 }
        );
        let g = graph_times(&trace).unwrap();
        assert_eq!(g.launches, 6);
        // The first launch (9 µs: cold) is left out; the gaps are 3, 2, 3 and 13 µs, the last
        // one long (13 - 3 = 10 µs over the median, 2.5 µs a step over four).
        assert_eq!(
            (g.span_us, g.period_us, g.mean_period_us),
            (7.0, 10.0, 12.5)
        );
        assert_eq!((g.gap_us, g.copies_us), (3.0, 0.5));
        assert_eq!(
            (g.long_gaps.as_slice(), g.long_gaps_us),
            (&[(3, 13.0)][..], 2.5)
        );
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9;
        assert!(close(g.sync_returned_us, 0.4), "{g:?}");
        assert!(close(g.launch_called_us, 1.25), "{g:?}");
        assert!(close(g.launch_call_us, 0.3), "{g:?}");
        assert!(close(g.launch_to_start_us, 1.25), "{g:?}");
        // Per gap (four), most time first: the synchronize's part after the step's end, the launch.
        let names: Vec<&str> = g.calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            names,
            ["cudaStreamSynchronize_v3020", "cudaGraphLaunch_v10000"]
        );
        assert!((g.calls[0].1 - 0.5).abs() < 1e-9 && (g.calls[0].2 - 0.2).abs() < 1e-9);
        assert!((g.calls[1].1 - 0.5).abs() < 1e-9 && (g.calls[1].2 - 0.15).abs() < 1e-9);
        let few = parse(&text(&["g 0 5 0 7 1 4", "g 10 15 0 7 2 4", "e"])).unwrap();
        assert!(format!("{:#}", graph_times(&few).unwrap_err()).contains("2 graph launches"));
        assert!(
            format!("{:#}", parse(&text(&["g 0 5 0 7 1", "e"])).unwrap_err()).contains("6 fields")
        );
    }

    #[test]
    fn broken_traces_are_errors_that_say_where() {
        let err = |lines: &[&str]| format!("{:#}", parse(&text(lines)).unwrap_err());
        assert!(err(&["n 0 a"]).contains("no end marker"));
        assert!(err(&["k 0 1 2 0 0 1 1 1 1 1 1 1 1", "e"]).contains("name 0 was not defined"));
        assert!(err(&["n 1 a", "e"]).contains("out of order"));
        assert!(err(&["n 0 a", "k 0 5 2 0 0 1 1 1 1 1 1 1 1", "e"]).contains("ends before"));
        assert!(err(&["n 0 a", "k 0 1 2 0 0 1 1 1 1 1 1 1", "e"]).contains("13 fields"));
        assert!(err(&["s 1 2 x 0 0 1 1", "e"]).contains("line 2"));
        assert!(err(&["q 1", "e"]).contains("unknown record"));
        assert!(err(&["e", "d 1"]).contains("after the end marker"));
        assert!(format!("{:#}", parse("GGUF").unwrap_err()).contains("not a flashrt-cupti-trace"));
        assert!(
            format!("{:#}", parse("# flashrt-cupti-trace 2\ne\n").unwrap_err())
                .contains("rebuild the injection library")
        );
    }

    fn kernel(start: u64, end: u64, correlation: u32, graph: u32) -> Record {
        Record {
            activity: Activity::Kernel {
                name: 0,
                grid: [1, 1, 1],
                block: [32, 1, 1],
            },
            start,
            end,
            device: 0,
            stream: 1,
            correlation,
            graph,
        }
    }

    #[test]
    fn graph_launches_are_steps_and_eager_work_is_counted_apart() {
        let memset = Record {
            activity: Activity::Memset { bytes: 4 },
            ..kernel(15, 16, 9, 1)
        };
        let trace = Trace {
            names: vec!["k".into()],
            records: vec![
                kernel(0, 5, 1, 0),
                kernel(30, 35, 10, 1),
                kernel(10, 14, 9, 1),
                memset,
                kernel(36, 40, 10, 1),
                kernel(12, 20, 9, 1),
                kernel(50, 51, 11, 0),
            ],
            dropped: 0,
        };
        let (steps, outside) = graph_steps(&trace);
        assert_eq!(outside, 2);
        assert_eq!(steps.len(), 2);
        assert_eq!(
            (
                steps[0].correlation,
                steps[0].kernels,
                steps[0].start,
                steps[0].end
            ),
            (9, 2, 10, 20)
        );
        assert_eq!(steps[0].records, [2, 5, 3]);
        assert_eq!((steps[1].correlation, steps[1].kernels), (10, 2));
    }

    fn steps_with(kernels: &[usize]) -> Vec<Step> {
        kernels
            .iter()
            .enumerate()
            .map(|(i, &k)| Step {
                correlation: i as u32,
                records: Vec::new(),
                kernels: k,
                start: i as u64 * 100,
                end: i as u64 * 100 + 90,
            })
            .collect()
    }

    #[test]
    fn the_steady_steps_have_the_modal_kernel_count_less_the_first() {
        let s = steady_steps(&steps_with(&[700, 1584, 1584, 1584, 1584, 12])).unwrap();
        assert_eq!(s.kernels_per_step, 1584);
        assert_eq!(s.steps, [2, 3, 4]);
        assert_eq!(s.other, [(12, 1), (700, 1)]);
        // Two steps: both kept.
        assert_eq!(steady_steps(&steps_with(&[9, 5, 5])).unwrap().steps, [1, 2]);
        // A tie goes to the count seen last.
        assert_eq!(
            steady_steps(&steps_with(&[3, 3, 4, 4]))
                .unwrap()
                .kernels_per_step,
            4
        );
        assert!(
            format!("{:#}", steady_steps(&[]).unwrap_err()).contains("GGML_CUDA_DISABLE_GRAPHS")
        );
    }

    #[test]
    fn exclusive_times_sum_to_the_union_and_overlap_goes_to_the_earlier_kernel() {
        // B starts under A (PDL), C lies inside B, D after a gap; given out of order.
        let a = (0, 10);
        let b = (5, 15);
        let c = (12, 14);
        let d = (20, 25);
        assert_eq!(exclusive(&[c, a, d, b]), [0, 10, 5, 5]);
        let union = 15 + 5;
        assert_eq!(exclusive(&[a, b, c, d]).iter().sum::<u64>(), union);
        // Identical intervals: the first in start order takes it all.
        assert_eq!(exclusive(&[(3, 8), (3, 8)]), [5, 0]);
        // A longer kernel starting at the same time sorts after the shorter one.
        assert_eq!(exclusive(&[(3, 9), (3, 4)]), [5, 1]);
        assert!(exclusive(&[]).is_empty());
    }
}
