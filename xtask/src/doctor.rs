//! `cargo xtask doctor`: what this machine has for building and testing, and how to fix what is
//! missing. It looks only; nothing is installed.

use anyhow::Result;
use xshell::{cmd, Shell};

use crate::host;
use crate::project::Project;
use crate::toolchain::{self, CudaChoice, DriverLibrary, Provision};

/// One line of the report.
struct Finding {
    what: &'static str,
    state: String,
    /// The exact command that fixes it, when something is missing.
    fix: Option<String>,
}

/// The visible NVIDIA GPUs as (name, compute capability like "9.0"), or why none are visible.
pub fn gpus(sh: &Shell) -> Result<Vec<(String, String)>, String> {
    if which::which("nvidia-smi").is_err() {
        return Err("nvidia-smi not found (no NVIDIA driver)".into());
    }
    let out = cmd!(
        sh,
        "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader"
    )
    .quiet()
    .ignore_stderr()
    .read()
    .map_err(|err| format!("nvidia-smi failed: {err}"))?;
    let gpus: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| l.rsplit_once(','))
        .map(|(name, cc)| (name.trim().to_owned(), cc.trim().to_owned()))
        .collect();
    if gpus.is_empty() {
        return Err("nvidia-smi lists no GPU".into());
    }
    Ok(gpus)
}

pub fn run(sh: &Shell, project: &Project) -> Result<()> {
    let mut findings = Vec::new();
    for (what, name, fix) in [
        ("git", "git", "apt-get install -y git"),
        (
            "python3",
            "python3",
            "apt-get install -y python3 python3-pip",
        ),
        ("C++ compiler", "c++", "apt-get install -y g++"),
    ] {
        findings.push(match which::which(name) {
            Ok(path) => Finding {
                what,
                state: format!("{} ({})", path.display(), toolchain::version(sh, &path)),
                fix: None,
            },
            Err(_) => Finding {
                what,
                state: "missing".into(),
                fix: Some(fix.into()),
            },
        });
    }

    match toolchain::build_tools(sh, project, Provision::LookOnly) {
        Ok(tools) => {
            for (what, tool) in [("cmake", tools.cmake), ("ninja", tools.ninja)] {
                let state = format!("{} ({}, {})", tool.path.display(), tool.origin, toolchain::version(sh, &tool.path));
                findings.push(Finding { what, state, fix: None });
            }
        }
        Err(err) => findings.push(Finding {
            what: "cmake/ninja",
            state: format!("{err:#}"),
            fix: Some("cargo xtask build (installs the pinned cmake and ninja), or apt-get install -y cmake ninja-build".into()),
        }),
    }

    match toolchain::cuda(sh, project, Provision::LookOnly, CudaChoice::Machine) {
        Ok(cuda) => {
            let state = format!(
                "{} ({}, {})",
                cuda.nvcc.path.display(),
                cuda.nvcc.origin,
                toolchain::version(sh, &cuda.nvcc.path)
            );
            findings.push(Finding {
                what: "nvcc",
                state,
                fix: None,
            });
            findings.push(match cuda.driver {
                Some(DriverLibrary::Installed) => Finding {
                    what: "libcuda",
                    state: "NVIDIA driver installed: CUDA builds link and run here".into(),
                    fix: None,
                },
                Some(DriverLibrary::Stub) => Finding {
                    what: "libcuda",
                    state: "link stub only: CUDA builds link here and run where a driver is".into(),
                    fix: None,
                },
                None => Finding {
                    what: "libcuda",
                    state: "not found: only --overlay-only and --cpu builds work here".into(),
                    fix: Some(
                        "install the NVIDIA driver or a full CUDA toolkit (it has lib64/stubs)"
                            .into(),
                    ),
                },
            });
        }
        Err(err) => findings.push(Finding {
            what: "nvcc",
            state: format!("{err:#}"),
            fix: Some(
                "cargo xtask build --overlay-only (installs the pinned CUDA 13.0 toolkit with pip)"
                    .into(),
            ),
        }),
    }

    findings.push(match gpus(sh) {
        Ok(gpus) => Finding {
            what: "GPU",
            state: gpus
                .iter()
                .map(|(n, cc)| format!("{n} (sm_{})", cc.replace('.', "")))
                .collect::<Vec<_>>()
                .join(", "),
            fix: None,
        },
        Err(why) => Finding {
            what: "GPU",
            state: format!("none visible: {why}"),
            fix: None,
        },
    });

    for name in project.host_names()? {
        let host = project.host(&name)?;
        let state = match host::cached_pristine(project, &host) {
            Some(stamp) => format!("fetched from {}", stamp.source),
            None if host.rev.is_none() => "not pinned; needs --host-src".into(),
            None => "not fetched yet".into(),
        };
        let fix = host::cached_pristine(project, &host).is_none().then(|| {
            format!(
                "cargo xtask host fetch --host {name}{}",
                if host.rev.is_none() {
                    " --host-src DIR"
                } else {
                    ""
                }
            )
        });
        findings.push(Finding {
            what: "host",
            state: format!("{name}: {state}"),
            fix,
        });
    }

    let width = findings.iter().map(|f| f.what.len()).max().unwrap_or(0);
    for finding in &findings {
        println!("{:width$}  {}", finding.what, finding.state);
        if let Some(fix) = &finding.fix {
            println!("{:width$}  fix: {fix}", "");
        }
    }
    Ok(())
}
