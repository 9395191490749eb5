//! The overlay's launch log (`GGML_FLASHRT_LAUNCH_LOG=<file>`, overlay/diagnostics.cu): one line
//! per weight-reading launch a window makes while the node loop runs (captures, uncaptured
//! evaluations), never on CUDA graph replays: `pass \t window \t bytes \t weights` (tensor names
//! joined by ` / `). A step replays
//! one capture, so the k-th logged kernel of a steady step is the k-th launch of a pass with as
//! many launches: that is how the GEMV windows' kernels get their bytes, which their grid (one
//! block an SM) cannot tell.

use anyhow::{bail, Context, Result};

use super::weights::role_of;

/// The kernels whose launches the log describes, in the order they run (vendor/csrc/gemv*, and
/// router-f32, which frt_gemv runs for the ROUTER launch unless `GGML_FLASHRT_ROUTER_F32=0`).
const LOGGED_KERNELS: &[&str] = &[
    "frt_gemv_registers_kernel",
    "frt_gemv_bulk_kernel",
    "frt_gemv_exact_kernel",
    "frt_gemv_head_kernel",
    "frt_router_f32_kernel",
];

/// True for a kernel function whose launches are in the launch log.
pub fn is_logged(function: &str) -> bool {
    LOGGED_KERNELS.contains(&function)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedLaunch {
    pub window: String,
    pub bytes: u64,
    /// The weights' roles, e.g. `attn_qkv / attn_gate / ssm_beta / ssm_alpha`.
    pub roles: String,
}

/// The log's launches grouped by node-loop pass, passes in the order they first appear.
pub fn parse(text: &str) -> Result<Vec<Vec<LoggedLaunch>>> {
    let mut passes: Vec<(u64, Vec<LoggedLaunch>)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [pass, window, bytes, names] = fields[..] else {
            bail!(
                "launch log line {}: {} tab-separated fields, expected 4 (pass, window, bytes, weights)",
                n + 1,
                fields.len()
            );
        };
        let pass: u64 = pass
            .parse()
            .with_context(|| format!("launch log line {}: pass {pass:?}", n + 1))?;
        let launch = LoggedLaunch {
            window: window.to_owned(),
            bytes: bytes
                .parse()
                .with_context(|| format!("launch log line {}: bytes {bytes:?}", n + 1))?,
            roles: names
                .split(" / ")
                .map(role_of)
                .collect::<Vec<_>>()
                .join(" / "),
        };
        match passes.iter_mut().find(|(p, _)| *p == pass) {
            Some((_, launches)) => launches.push(launch),
            None => passes.push((pass, vec![launch])),
        }
    }
    Ok(passes.into_iter().map(|(_, launches)| launches).collect())
}

/// The launches of the last pass with exactly `n` of them (the capture the steady steps replay),
/// or why there is none.
pub fn pass_with(passes: &[Vec<LoggedLaunch>], n: usize) -> Result<&[LoggedLaunch], String> {
    passes
        .iter()
        .rev()
        .find(|p| p.len() == n)
        .map(Vec::as_slice)
        .ok_or_else(|| {
            let counts: Vec<String> = passes.iter().map(|p| p.len().to_string()).collect();
            format!(
                "no pass of the launch log has {n} launches (passes: {})",
                if counts.is_empty() {
                    "none".to_owned()
                } else {
                    counts.join(", ")
                }
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(window: &str, bytes: u64, roles: &str) -> LoggedLaunch {
        LoggedLaunch {
            window: window.into(),
            bytes,
            roles: roles.into(),
        }
    }

    #[test]
    fn lines_group_by_pass_in_order() {
        let text = "3\tINPROJ\t100\tblk.0.attn_qkv.weight / blk.0.attn_gate.weight\n\
                    3\tHEAD\t7\toutput.weight\n\n5\tMATVEC\t9\tblk.7.ssm_out.weight\n";
        let passes = parse(text).unwrap();
        assert_eq!(
            passes,
            vec![
                vec![
                    launch("INPROJ", 100, "attn_qkv / attn_gate"),
                    launch("HEAD", 7, "output")
                ],
                vec![launch("MATVEC", 9, "ssm_out")],
            ]
        );
    }

    #[test]
    fn malformed_lines_say_which_and_why() {
        let err = parse("1\tINPROJ\t100\n").unwrap_err().to_string();
        assert!(
            err.contains("line 1") && err.contains("3 tab-separated fields"),
            "{err}"
        );
        let err = parse("1\tINPROJ\tmany\tx\n").unwrap_err();
        assert!(format!("{err:#}").contains("bytes \"many\""), "{err:#}");
    }

    #[test]
    fn the_last_pass_with_the_steps_launch_count_is_taken() {
        let passes = vec![
            vec![launch("A", 1, "a"), launch("B", 2, "b")],
            vec![launch("A", 3, "a")],
            vec![launch("A", 4, "a"), launch("B", 5, "b")],
        ];
        assert_eq!(pass_with(&passes, 2).unwrap()[0].bytes, 4);
        assert_eq!(pass_with(&passes, 1).unwrap()[0].bytes, 3);
        let err = pass_with(&passes, 7).unwrap_err();
        assert!(
            err.contains("7 launches") && err.contains("2, 1, 2"),
            "{err}"
        );
        assert!(pass_with(&[], 1).unwrap_err().contains("none"));
    }

    #[test]
    fn the_logged_kernels_exist_in_vendor_csrc() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendor/csrc");
        let mut sources = String::new();
        for entry in std::fs::read_dir(&root).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "cu" || e == "cuh") {
                sources += &std::fs::read_to_string(&path).unwrap();
            }
        }
        for name in LOGGED_KERNELS {
            assert!(
                sources.contains(&format!("void {name}(")),
                "{name} is not a kernel in vendor/csrc"
            );
        }
    }
}
