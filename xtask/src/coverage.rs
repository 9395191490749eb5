//! `cargo xtask coverage <dump>`: what a GGML_FLASHRT_DUMP file says about one graph: how many of
//! its compute nodes windows take, and the ops no window covers, most frequent first.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct CoverageArgs {
    /// A file written with GGML_FLASHRT_DUMP=<file>.
    pub dump: PathBuf,
    /// Which graph of the dump (default: the last one, usually a decode step).
    #[arg(long)]
    pub graph: Option<usize>,
}

/// One node line of a dump.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    op: String,
    name: String,
    window: Option<String>,
}

/// Ops that launch nothing; they are neither covered nor uncovered.
const VIEW_OPS: [&str; 5] = ["NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"];

fn parse(text: &str) -> Result<Vec<Vec<Node>>> {
    let mut graphs: Vec<Vec<Node>> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.starts_with("#graph") {
            graphs.push(Vec::new());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let (Some(graph), [_, op, name, _, window, ..]) = (graphs.last_mut(), fields.as_slice())
        else {
            bail!(
                "line {}: not a dump node line (index, op, name, shape, window, sources)",
                number + 1
            );
        };
        graph.push(Node {
            op: (*op).to_owned(),
            name: (*name).to_owned(),
            window: (*window != "-").then(|| (*window).to_owned()),
        });
    }
    if graphs.is_empty() {
        bail!("no #graph header: not a GGML_FLASHRT_DUMP file");
    }
    Ok(graphs)
}

/// Node names without the layer suffix ("attn_norm-12" -> "attn_norm").
fn stem(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((stem, layer)) if layer.chars().all(|c| c.is_ascii_digit()) => stem,
        _ => name,
    }
}

#[derive(Debug, PartialEq)]
struct Report {
    compute_nodes: usize,
    covered: usize,
    by_window: BTreeMap<String, usize>,
    /// (op, count, up to three example name stems), most frequent first.
    uncovered: Vec<(String, usize, Vec<String>)>,
}

fn report(graph: &[Node]) -> Report {
    let mut by_window = BTreeMap::new();
    let mut uncovered: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut compute_nodes = 0;
    for node in graph.iter().filter(|n| !VIEW_OPS.contains(&n.op.as_str())) {
        compute_nodes += 1;
        match &node.window {
            Some(window) => *by_window.entry(window.clone()).or_insert(0) += 1,
            None => {
                let entry = uncovered.entry(node.op.clone()).or_default();
                entry.0 += 1;
                let name = stem(&node.name).to_owned();
                if entry.1.len() < 3 && !entry.1.contains(&name) {
                    entry.1.push(name);
                }
            }
        }
    }
    let mut uncovered: Vec<(String, usize, Vec<String>)> = uncovered
        .into_iter()
        .map(|(op, (count, names))| (op, count, names))
        .collect();
    uncovered.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Report {
        compute_nodes,
        covered: by_window.values().sum(),
        by_window,
        uncovered,
    }
}

pub fn run(args: CoverageArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.dump)
        .with_context(|| format!("reading {}", args.dump.display()))?;
    let graphs = parse(&text).with_context(|| format!("parsing {}", args.dump.display()))?;
    let index = args.graph.unwrap_or(graphs.len() - 1);
    let Some(graph) = graphs.get(index) else {
        bail!(
            "{} holds graphs 0..{}; no graph {index}",
            args.dump.display(),
            graphs.len() - 1
        );
    };
    let r = report(graph);
    println!(
        "graph {index} of {}: {} nodes, {} compute nodes, {} covered by windows ({:.1}%)",
        graphs.len(),
        graph.len(),
        r.compute_nodes,
        r.covered,
        100.0 * r.covered as f64 / r.compute_nodes.max(1) as f64
    );
    for (window, count) in &r.by_window {
        println!("  window {window}: {count} nodes");
    }
    println!("\n| uncovered op | nodes | share | e.g. |\n|---|---:|---:|---|");
    for (op, count, names) in &r.uncovered {
        let share = 100.0 * *count as f64 / r.compute_nodes.max(1) as f64;
        println!("| {op} | {count} | {share:.1}% | {} |", names.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "#graph\t0\tnodes\t3\n#index\top\tname\tshape\twindow\tsources\n\
        0\tRMS_NORM\tnorm-0\tf32[4,1,1,1]\t-\t\n\
        1\tMUL\tattn_norm-0\tf32[4,1,1,1]\t-\t\n\
        2\tRESHAPE\tr-0\tf32[4,1,1,1]\t-\t\n\
        #graph\t1\tnodes\t6\n#index\top\tname\tshape\twindow\tsources\n\
        0\tRMS_NORM\tnorm-0\tf32[4,1,1,1]\tW\t\n\
        1\tMUL\tnode_1\tf32[4,1,1,1]\tW\t\n\
        2\tMUL_MAT\tz-0\tf32[4,1,1,1]\t-\t\n\
        3\tRESHAPE\tz-0 (reshaped)\tf32[4,1,1,1]\t-\t\n\
        4\tMUL_MAT\tz-1\tf32[4,1,1,1]\t-\t\n\
        5\tADD\tl_out-1\tf32[4,1,1,1]\t-\t\n";

    #[test]
    fn counts_covered_and_uncovered_compute_nodes() {
        let graphs = parse(DUMP).unwrap();
        assert_eq!(graphs.len(), 2);
        let r = report(&graphs[1]);
        assert_eq!(r.compute_nodes, 5);
        assert_eq!(r.covered, 2);
        assert_eq!(r.by_window.get("W"), Some(&2));
        assert_eq!(
            r.uncovered,
            [
                ("MUL_MAT".to_owned(), 2, vec!["z".to_owned()]),
                ("ADD".to_owned(), 1, vec!["l_out".to_owned()])
            ]
        );
        let first = report(&graphs[0]);
        assert_eq!((first.compute_nodes, first.covered), (2, 0));
    }

    #[test]
    fn rejects_files_that_are_not_dumps() {
        assert!(parse("hello\n").is_err());
        assert!(parse("#graph\t0\tnodes\t1\nnot\tenough\n").is_err());
    }
}
