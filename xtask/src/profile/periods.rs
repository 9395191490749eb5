//! The untraced runs' step periods: the host time of each graph compute call, which the overlay
//! marks when GGML_FLASHRT_PERIODS names a file (overlay/diagnostics.cuh; stock's calls too, the
//! mark comes before the overlay's off switch). Call to call is a decode step's whole period, host
//! work and first-token costs included, with no tracer slowing anything: what tok/s pays.

use anyhow::{bail, Context, Result};
use serde::Serialize;

const HEADER: &str = "# flashrt-periods 1";

/// One graph compute call: when (ns, steady clock) and whether ggml-cuda ran its node loop for
/// it (a capture or a direct evaluation) instead of replaying a captured graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub ns: i64,
    pub node_loop: bool,
}

pub fn parse(text: &str) -> Result<Vec<Mark>> {
    let mut lines = text.lines().enumerate();
    if lines.next().map(|(_, l)| l) != Some(HEADER) {
        bail!("not a GGML_FLASHRT_PERIODS file (no {HEADER:?} line)");
    }
    let mut marks = Vec::new();
    for (index, line) in lines {
        let at = || format!("periods line {}: {line:?}", index + 1);
        let (ns, node_loop) = line.split_once(' ').with_context(at)?;
        let ns: i64 = ns.parse().with_context(at)?;
        let node_loop = match node_loop {
            "0" => false,
            "1" => true,
            _ => bail!("{}: the node-loop flag is 0 or 1", at()),
        };
        if marks.last().is_some_and(|m: &Mark| m.ns > ns) {
            bail!("{}: earlier than the call before it", at());
        }
        marks.push(Mark { ns, node_loop });
    }
    Ok(marks)
}

/// A setting's untraced runs, per decode step (µs), over llama-bench's timed repetitions: the
/// calls after the warm-up call, cut into repetitions of `tokens` calls each.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Periods {
    pub reps: usize,
    /// Median call-to-call time inside the repetitions: the steady step.
    pub median_us: f64,
    /// Mean call-to-call time inside the repetitions: what tok/s pays.
    pub mean_us: f64,
    /// Node-loop calls (captures, direct evaluations) a repetition.
    pub node_loop_calls: f64,
    /// Periods over twice the median, a repetition, and their excess over the median a step.
    pub long: f64,
    pub long_excess_us: f64,
    /// The first steps of a repetition (medians over the repetitions): where its fixed costs sit.
    pub first_us: Vec<f64>,
}

/// `marks` of one llama-bench process that ran a warm-up step and then `reps` repetitions of
/// `tokens` steps, one graph compute call a step. With `depth` (llama-bench's -d), the first
/// repetition's steps come after the depth prompt's calls (one a batch; llama-bench restores
/// the state it left before the later repetitions): the calls between the warm-up call and the
/// decode steps, however many, are that prompt's and left out.
pub fn summarise(marks: &[Mark], tokens: usize, reps: usize, depth: bool) -> Result<Periods> {
    if tokens < 2 || reps == 0 {
        bail!("periods need 2 or more tokens and 1 or more repetitions");
    }
    let steps_calls = 1 + tokens * reps;
    let prompt_calls = marks.len().saturating_sub(steps_calls);
    if marks.len() < steps_calls || (prompt_calls > 0) != depth {
        bail!(
            "{} graph compute calls, {} expected (a warm-up step{} and {reps} repetitions of \
             {tokens}): the run did not compute one graph a step",
            marks.len(),
            steps_calls,
            if depth {
                ", the depth prompt's calls"
            } else {
                ""
            }
        );
    }
    let us = |a: &Mark, b: &Mark| (b.ns - a.ns) as f64 / 1e3;
    let runs: Vec<&[Mark]> = marks[1 + prompt_calls..].chunks(tokens).collect();
    let steps: Vec<f64> = runs
        .iter()
        .flat_map(|run| run.windows(2).map(|w| us(&w[0], &w[1])))
        .collect();
    let median_us = crate::bench::median(&steps);
    let long: Vec<f64> = steps
        .iter()
        .filter(|&&p| p > 2.0 * median_us)
        .copied()
        .collect();
    let first_us = (0..(tokens - 1).min(4))
        .map(|k| {
            let at: Vec<f64> = runs.iter().map(|run| us(&run[k], &run[k + 1])).collect();
            crate::bench::median(&at)
        })
        .collect();
    Ok(Periods {
        reps,
        median_us,
        mean_us: steps.iter().sum::<f64>() / steps.len() as f64,
        node_loop_calls: runs
            .iter()
            .map(|run| run.iter().filter(|m| m.node_loop).count())
            .sum::<usize>() as f64
            / reps as f64,
        long: long.len() as f64 / reps as f64,
        long_excess_us: long.iter().map(|p| p - median_us).sum::<f64>() / steps.len() as f64,
        first_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(marks: &[(i64, u8)]) -> String {
        let mut out = format!("{HEADER}\n");
        for (ns, flag) in marks {
            out.push_str(&format!("{ns} {flag}\n"));
        }
        out
    }

    #[test]
    fn marks_parse_and_bad_files_say_why() {
        let marks = parse(&file(&[(5, 1), (9, 0)])).unwrap();
        assert_eq!(
            marks,
            [
                Mark {
                    ns: 5,
                    node_loop: true
                },
                Mark {
                    ns: 9,
                    node_loop: false
                }
            ]
        );
        assert!(format!("{:#}", parse("5 1\n").unwrap_err()).contains("not a GGML_FLASHRT_PERIODS"));
        assert!(format!("{:#}", parse(&file(&[(5, 2)])).unwrap_err()).contains("0 or 1"));
        assert!(format!("{:#}", parse(&file(&[(9, 0), (5, 0)])).unwrap_err()).contains("earlier"));
        assert!(
            format!("{:#}", parse(&format!("{HEADER}\nx 0\n")).unwrap_err()).contains("line 2")
        );
    }

    #[test]
    fn repetitions_give_the_steady_step_what_tok_s_pays_and_the_first_steps() {
        // A warm-up call, then two repetitions of 5 steps: steps of 100 µs, but each repetition's
        // first step takes 1000 µs (a capture: node loop) and the second run's fourth 350 µs.
        let mut marks = vec![(0, 1)];
        let mut t = 50_000_000;
        for rep in 0..2 {
            t += 20_000_000; // between repetitions: not a step
            let steps = [1000, 100, 100, if rep == 1 { 350 } else { 100 }];
            marks.push((t, 1));
            for s in steps {
                t += s * 1000;
                marks.push((t, 0));
            }
        }
        let p = summarise(&parse(&file(&marks)).unwrap(), 5, 2, false).unwrap();
        assert_eq!((p.reps, p.median_us), (2, 100.0));
        // (1000 + 3 x 100 + 1000 + 2 x 100 + 350) / 8 steps
        assert!((p.mean_us - 2850.0 / 8.0).abs() < 1e-9, "{p:?}");
        assert_eq!((p.node_loop_calls, p.long), (1.0, 1.5));
        assert!((p.long_excess_us - (900.0 * 2.0 + 250.0) / 8.0).abs() < 1e-9);
        assert_eq!(p.first_us, [1000.0, 100.0, 100.0, 225.0]);
        let err = summarise(&parse(&file(&marks)).unwrap(), 4, 2, false).unwrap_err();
        assert!(format!("{err:#}").contains("11 graph compute calls, 9 expected"));
        // A run said to have a depth prompt but without a prompt's calls is refused.
        let err = summarise(&parse(&file(&marks)).unwrap(), 5, 2, true).unwrap_err();
        assert!(
            format!("{err:#}").contains("the depth prompt's calls"),
            "{err:#}"
        );
    }

    #[test]
    fn a_depth_prompt_before_the_first_repetition_is_left_out() {
        // A warm-up call, 16 prompt batches of 30 ms (node loop: no CUDA graph), then two
        // repetitions of 4 steps of 200 µs, the first step of each 900 µs.
        let mut marks = vec![(0, 1)];
        let mut t = 10_000_000;
        for _ in 0..16 {
            t += 30_000_000;
            marks.push((t, 1));
        }
        for _ in 0..2 {
            t += 5_000_000;
            marks.push((t, 1));
            for s in [900, 200, 200] {
                t += s * 1000;
                marks.push((t, 0));
            }
        }
        let marks = parse(&file(&marks)).unwrap();
        let p = summarise(&marks, 4, 2, true).unwrap();
        assert_eq!((p.median_us, p.node_loop_calls), (200.0, 1.0));
        assert!((p.mean_us - 1300.0 / 3.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.first_us, [900.0, 200.0, 200.0]);
        // Without the depth, the prompt's calls are an error, not steps.
        let err = summarise(&marks, 4, 2, false).unwrap_err();
        assert!(
            format!("{err:#}").contains("25 graph compute calls, 9 expected"),
            "{err:#}"
        );
    }
}
