//! Finding cmake, ninja and nvcc, and installing pinned ones (toolchains.toml) into
//! .xtask/toolchains when a machine has none.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::config::PipToolchain;
use crate::fsutil;
use crate::project::{note, step, Project};

/// A tool and where it came from, for messages and `doctor`.
#[derive(Debug, Clone)]
pub struct Tool {
    pub path: PathBuf,
    pub origin: &'static str,
}

#[derive(Debug, Clone)]
pub struct BuildTools {
    pub cmake: Tool,
    pub ninja: Tool,
}

#[derive(Debug, Clone)]
pub struct Cuda {
    pub nvcc: Tool,
    /// The toolkit root (bin/, include/, lib/).
    pub root: PathBuf,
    /// libcuda.so (the driver, or a toolkit stub) can be linked against. The pip toolkit has none,
    /// so builds with it can compile but not link ggml-cuda.
    pub can_link_driver: bool,
}

/// What may be done when a tool is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provision {
    /// Install the pinned toolchain into .xtask/toolchains.
    Install,
    /// Only look.
    LookOnly,
}

pub fn build_tools(sh: &Shell, project: &Project, provision: Provision) -> Result<BuildTools> {
    let on_path = |name: &str| {
        which::which(name).ok().map(|path| Tool {
            path,
            origin: "PATH",
        })
    };
    let (cmake, ninja) = (on_path("cmake"), on_path("ninja"));
    if let (Some(cmake), Some(ninja)) = (&cmake, &ninja) {
        return Ok(BuildTools {
            cmake: cmake.clone(),
            ninja: ninja.clone(),
        });
    }
    // Only the missing tool comes from the pinned install.
    let pins = project.toolchains()?.cmake;
    let dir = pip_toolchain(sh, project, &pins, "cmake and ninja", provision)?;
    let pinned = |name: &str| -> Result<Tool> {
        let rel = pins
            .tools
            .get(name)
            .with_context(|| format!("toolchains.toml [cmake] names no {name}"))?;
        Ok(Tool {
            path: dir.join(rel),
            origin: "xtask toolchain",
        })
    };
    Ok(BuildTools {
        cmake: cmake.map_or_else(|| pinned("cmake"), Ok)?,
        ninja: ninja.map_or_else(|| pinned("ninja"), Ok)?,
    })
}

/// nvcc from PATH, $CUDA_HOME, /usr/local/cuda, or the pinned pip toolkit.
pub fn cuda(sh: &Shell, project: &Project, provision: Provision) -> Result<Cuda> {
    let mut candidates: Vec<(PathBuf, &'static str)> = Vec::new();
    if let Ok(path) = which::which("nvcc") {
        candidates.push((path, "PATH"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            candidates.push((Path::new(&home).join("bin/nvcc"), "CUDA_HOME"));
        }
    }
    candidates.push((PathBuf::from("/usr/local/cuda/bin/nvcc"), "/usr/local/cuda"));
    for (nvcc, origin) in candidates {
        if nvcc.is_file() {
            let nvcc = nvcc.canonicalize().unwrap_or(nvcc);
            let root = nvcc
                .parent()
                .and_then(Path::parent)
                .context("nvcc has no toolkit root")?
                .to_path_buf();
            let can_link_driver = has_driver_library(&root);
            return Ok(Cuda {
                nvcc: Tool { path: nvcc, origin },
                root,
                can_link_driver,
            });
        }
    }
    let pins = project.toolchains()?.cuda;
    let dir = pip_toolchain(sh, project, &pins, "the CUDA toolkit (nvcc)", provision)?;
    let nvcc = dir.join(
        pins.tools
            .get("nvcc")
            .context("toolchains.toml [cuda] names no nvcc")?,
    );
    let root = dir.join(
        pins.root
            .as_deref()
            .context("toolchains.toml [cuda] has no root")?,
    );
    Ok(Cuda {
        nvcc: Tool {
            path: nvcc,
            origin: "xtask toolchain",
        },
        can_link_driver: has_driver_library(&root),
        root,
    })
}

fn has_driver_library(root: &Path) -> bool {
    let dirs = [
        root.join("lib64/stubs"),
        root.join("lib/stubs"),
        root.join("lib64"),
        root.join("lib"),
    ];
    let system = [
        PathBuf::from("/usr/lib/x86_64-linux-gnu"),
        PathBuf::from("/usr/lib64"),
        PathBuf::from("/usr/local/nvidia/lib64"),
    ];
    dirs.iter()
        .chain(system.iter())
        .any(|d| d.join("libcuda.so").exists() || d.join("libcuda.so.1").exists())
}

/// The pinned pip toolchain's directory, installed first if allowed.
fn pip_toolchain(
    sh: &Shell,
    project: &Project,
    pins: &PipToolchain,
    what: &str,
    provision: Provision,
) -> Result<PathBuf> {
    let dir = project.toolchains_dir().join(&pins.dir);
    let complete = dir.join(".complete");
    if complete.is_file() {
        return Ok(dir);
    }
    if provision == Provision::LookOnly {
        bail!("{what} not found (looked on PATH and in {})", dir.display());
    }
    let python = which::which("python3").with_context(|| {
        format!(
            "{what} not found, and python3 (with pip) is needed to install the pinned one into {}",
            dir.display()
        )
    })?;
    step(format!(
        "{what} not found: installing {} into {} (pip)",
        pins.packages.join(" "),
        dir.display()
    ));
    let scratch = project.scratch()?;
    let staged = scratch.path().join("toolchain");
    let packages = &pins.packages;
    cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target {staged} {packages...}")
        .run()
        .with_context(|| format!("installing {what} with pip"))?;
    if let Some(root) = &pins.root {
        fix_cuda_layout(&staged.join(root))?;
    }
    for rel in pins.tools.values() {
        let tool = staged.join(rel);
        if !tool.is_file() {
            bail!("the pinned install of {what} has no {rel}");
        }
        fsutil::set_executable(&tool)?;
    }
    std::fs::write(staged.join(".complete"), pins.packages.join("\n"))?;
    fsutil::replace_dir(&staged, &dir)?;
    note(format!("installed {what} in {}", dir.display()));
    Ok(dir)
}

/// The pip wheels lay CUDA out as bin/, include/, lib/ with versioned libraries only. nvcc's
/// profile and CMake's FindCUDAToolkit expect lib64/ and unversioned names.
fn fix_cuda_layout(root: &Path) -> Result<()> {
    let lib = root.join("lib");
    if !root.join("lib64").exists() {
        std::os::unix::fs::symlink("lib", root.join("lib64")).context("linking lib64")?;
    }
    for entry in std::fs::read_dir(&lib).with_context(|| format!("listing {}", lib.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some((stem, _version)) = name.split_once(".so.") {
            let plain = lib.join(format!("{stem}.so"));
            if !plain.exists() {
                std::os::unix::fs::symlink(&name, &plain)
                    .with_context(|| format!("linking {}", plain.display()))?;
            }
        }
    }
    Ok(())
}

/// First line of `tool --version`, or why it could not be read.
pub fn version(sh: &Shell, tool: &Path) -> String {
    match cmd!(sh, "{tool} --version").quiet().ignore_stderr().read() {
        Ok(out) => {
            let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
            // nvcc's last line carries the release; others print it first.
            let pick = if lines.iter().any(|l| l.contains("Cuda compilation tools")) {
                lines.iter().find(|l| l.contains("release")).copied()
            } else {
                lines.first().copied()
            };
            pick.unwrap_or("?").trim().to_owned()
        }
        Err(err) => format!("cannot run: {err}"),
    }
}
