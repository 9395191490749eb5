//! Where things are: the repository root, its config files and the .xtask work directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Serialize};

use crate::config::{HostConfig, Matrix, Toolchains};

/// The checkout xtask works on. Everything derived from it is a method, so that tests can point a
/// Project at a temporary directory.
#[derive(Debug, Clone)]
pub struct Project {
    pub root: PathBuf,
}

impl Project {
    /// The repository root: the nearest ancestor of the current directory that holds
    /// `xtask/Cargo.toml` and `hosts/`, else the checkout this binary was built from.
    pub fn discover() -> Result<Project> {
        let cwd = std::env::current_dir().context("reading the current directory")?;
        let built_from = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf);
        let candidates = cwd.ancestors().map(Path::to_path_buf).chain(built_from);
        for dir in candidates {
            if dir.join("xtask/Cargo.toml").is_file() && dir.join("hosts").is_dir() {
                return Ok(Project { root: dir });
            }
        }
        bail!(
            "not inside a FlashRT-llama.cpp checkout (no xtask/Cargo.toml and hosts/ above {}): \
             run cargo xtask from the repository",
            cwd.display()
        )
    }

    pub fn work(&self) -> PathBuf {
        self.root.join(".xtask")
    }

    pub fn overlay_dir(&self) -> PathBuf {
        self.root.join("overlay")
    }

    pub fn host_config_path(&self, host: &str) -> PathBuf {
        self.root.join("hosts").join(host).join("host.toml")
    }

    pub fn host(&self, host: &str) -> Result<HostConfig> {
        let path = self.host_config_path(host);
        if !path.is_file() {
            bail!(
                "unknown host {host:?}: no {} (known: {})",
                path.display(),
                self.host_names()?.join(", ")
            );
        }
        HostConfig::load(&path)
    }

    pub fn host_names(&self) -> Result<Vec<String>> {
        let dir = self.root.join("hosts");
        let mut names = Vec::new();
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let entry = entry?;
            if entry.path().join("host.toml").is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    pub fn toolchains(&self) -> Result<Toolchains> {
        Toolchains::load(&self.root.join("toolchains.toml"))
    }

    pub fn matrix(&self) -> Result<Matrix> {
        Matrix::load(&self.root.join("ci/matrix.toml"))
    }

    pub fn patches_dir(&self, host: &str) -> PathBuf {
        self.root.join("patches").join(host)
    }

    /// Per-host work files.
    pub fn host_work(&self, host: &str) -> PathBuf {
        self.work().join("hosts").join(host)
    }

    /// The verified pristine tree (never edited).
    pub fn pristine_dir(&self, host: &str) -> PathBuf {
        self.host_work(host).join("pristine")
    }

    /// The working tree: a git repository holding the pristine commit plus the patch series.
    pub fn tree_dir(&self, host: &str) -> PathBuf {
        self.host_work(host).join("src")
    }

    pub fn downloads(&self) -> PathBuf {
        self.work().join("downloads")
    }

    pub fn toolchains_dir(&self) -> PathBuf {
        self.work().join("toolchains")
    }

    pub fn build_dir(&self, name: &str) -> PathBuf {
        self.work().join("build").join(name)
    }

    /// Scratch space on the same file system as the work files, so that renames are atomic.
    /// Removed when dropped; what an interrupted run left behind is removed by the next one.
    pub fn scratch(&self) -> Result<tempfile::TempDir> {
        let parent = self.work().join("tmp");
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        remove_abandoned_scratch(&parent);
        tempfile::Builder::new()
            .prefix(&format!("scratch-{}-", std::process::id()))
            .tempdir_in(&parent)
            .with_context(|| format!("creating a scratch directory in {}", parent.display()))
    }
}

/// Removes scratch-<pid>-* directories whose process no longer runs.
fn remove_abandoned_scratch(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("scratch-")
            .and_then(|rest| rest.split('-').next());
        if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok()) {
            if !Path::new("/proc").join(pid.to_string()).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Small JSON stamp files that record finished steps, so reruns skip them.
pub fn read_stamp<T: DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

pub fn write_stamp<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    write_atomic(path, text.as_bytes())
}

/// Writes a file through a temporary sibling and a rename: readers never see half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("path has no parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))
}

/// Prints a step so long runs show progress.
pub fn step(message: impl std::fmt::Display) {
    eprintln!("==> {message}");
}

pub fn note(message: impl std::fmt::Display) {
    eprintln!("    {message}");
}
