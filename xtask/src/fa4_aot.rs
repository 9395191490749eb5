//! `cargo xtask fa4-aot`: FlashAttention-4 forward kernels compiled ahead of time.
//!
//! fa4_aot/manifest.toml lists the modules (architecture, element type, head dimension, query heads
//! per key/value head, causal) and the generator's pinned Python packages; fa4_aot/generate.py
//! compiles each module with the CuTe DSL into `fa4_aot/objects/sm_<arch>/<name>.{o,h}` on any
//! machine, no GPU needed. The objects are committed, so that builds need no Python; the manifest
//! holds their sha256, which `--check` verifies (a CI check) and a regeneration must reproduce.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use xshell::{cmd, Shell};

use crate::config::read_toml;
use crate::project::{step, Project};

#[derive(Debug, Args)]
pub struct Fa4AotArgs {
    /// Architectures to generate or check, comma-separated (default: every one in the manifest).
    #[arg(long, value_delimiter = ',', value_name = "ARCHS")]
    pub arch: Vec<String>,
    /// Only these modules (names as in the manifest), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub module: Vec<String>,
    /// Verify the committed objects against the manifest's sha256 instead (no Python needed).
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub toolchain: Toolchain,
    #[serde(rename = "module")]
    pub modules: Vec<Module>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Toolchain {
    /// pip requirements of the generator's virtual environment, every one pinned.
    pub packages: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Module {
    pub name: String,
    pub arch: String,
    /// "f16" or "bf16": Q, K, V and O.
    pub dtype: String,
    pub head_dim: u32,
    /// Query heads per key/value head (1: multi-head attention; more: grouped-query).
    pub qhead_per_kvhead: u32,
    pub causal: bool,
    /// What the module is for (the window and the models).
    pub used_by: String,
    /// sha256 of the object and the header; empty until first generated.
    #[serde(default)]
    pub object_sha256: String,
    #[serde(default)]
    pub header_sha256: String,
}

const MANIFEST_HEADER: &str = "\
# FlashAttention-4 forward kernels compiled ahead of time: `cargo xtask fa4-aot` writes
# fa4_aot/objects/sm_<arch>/<name>.{o,h} with fa4_aot/generate.py in a virtual environment of the
# packages below (no GPU needed) and records their sha256 here; `cargo xtask fa4-aot --check`
# verifies the committed objects against them. Add a module by adding an entry (hashes empty) and
# running the command. Entries are rewritten by the command: keep notes out of this file.
";

impl Manifest {
    pub fn path(project: &Project) -> PathBuf {
        project.root.join("fa4_aot").join("manifest.toml")
    }

    pub fn load(path: &Path) -> Result<Manifest> {
        let manifest: Manifest = read_toml(path)?;
        manifest
            .validate()
            .with_context(|| format!("{}", path.display()))?;
        Ok(manifest)
    }

    fn validate(&self) -> Result<()> {
        let mut names = BTreeSet::new();
        for m in &self.modules {
            if !names.insert(&m.name) {
                bail!("module {} is listed twice", m.name);
            }
            if !m
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                bail!(
                    "module {}: a name is a C identifier (letters, digits, _)",
                    m.name
                );
            }
            if !["f16", "bf16"].contains(&m.dtype.as_str()) {
                bail!("module {}: dtype {:?} (f16 or bf16)", m.name, m.dtype);
            }
            if m.head_dim == 0 || m.head_dim % 8 != 0 || m.head_dim > 256 {
                bail!(
                    "module {}: head_dim {} (a multiple of 8 up to 256)",
                    m.name,
                    m.head_dim
                );
            }
            if m.qhead_per_kvhead == 0 {
                bail!("module {}: qhead_per_kvhead must be at least 1", m.name);
            }
        }
        for p in &self.toolchain.packages {
            if !p.contains("==") {
                bail!("toolchain package {p:?} is not pinned (name==version)");
            }
        }
        Ok(())
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let body = toml::to_string(self).context("serializing the manifest")?;
        std::fs::write(path, format!("{MANIFEST_HEADER}\n{body}"))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The modules `args` select, or an error naming what matches nothing.
    fn select(&self, archs: &[String], names: &[String]) -> Result<Vec<&Module>> {
        for a in archs {
            if !self.modules.iter().any(|m| &m.arch == a) {
                bail!("the manifest has no module for arch {a}");
            }
        }
        for n in names {
            if !self.modules.iter().any(|m| &m.name == n) {
                bail!("the manifest has no module {n}");
            }
        }
        Ok(self
            .modules
            .iter()
            .filter(|m| archs.is_empty() || archs.contains(&m.arch))
            .filter(|m| names.is_empty() || names.contains(&m.name))
            .collect())
    }
}

/// Where a module's files are committed.
pub fn object_dir(root: &Path, arch: &str) -> PathBuf {
    root.join("fa4_aot")
        .join("objects")
        .join(format!("sm_{arch}"))
}

fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

/// What is wrong with the committed objects of `modules`, and files in the object folders that no
/// module names: one line each, empty when all is well.
pub fn check_objects(root: &Path, manifest: &Manifest, modules: &[&Module]) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut archs = BTreeSet::new();
    for m in modules {
        archs.insert(m.arch.clone());
        let dir = object_dir(root, &m.arch);
        for (ext, want) in [("o", &m.object_sha256), ("h", &m.header_sha256)] {
            let file = dir.join(format!("{}.{ext}", m.name));
            if want.is_empty() {
                problems.push(format!(
                    "{}: no sha256 recorded for its .{ext} (never generated)",
                    m.name
                ));
            } else if !file.is_file() {
                problems.push(format!("{}: {} is missing", m.name, file.display()));
            } else {
                let got = sha256_file(&file)?;
                if &got != want {
                    problems.push(format!(
                        "{}: {} has sha256 {got}, the manifest says {want}",
                        m.name,
                        file.display()
                    ));
                }
            }
        }
    }
    for arch in archs {
        let dir = object_dir(root, &arch);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry
                .with_context(|| format!("listing {}", dir.display()))?
                .path();
            let known = path
                .file_stem()
                .and_then(|s| s.to_str())
                .is_some_and(|stem| {
                    manifest
                        .modules
                        .iter()
                        .any(|m| m.name == stem && m.arch == arch)
                });
            if !known {
                problems.push(format!(
                    "{} belongs to no module of the manifest",
                    path.display()
                ));
            }
        }
    }
    Ok(problems)
}

/// The committed objects of `modules` must match the manifest (the CI check runs it on all).
pub fn check(project: &Project, manifest: &Manifest, modules: &[&Module]) -> Result<()> {
    let problems = check_objects(&project.root, manifest, modules)?;
    if !problems.is_empty() {
        bail!(
            "the committed FA4 objects do not match fa4_aot/manifest.toml:\n  {}\n\
             Regenerate them with `cargo xtask fa4-aot` (add --arch/--module to limit it).",
            problems.join("\n  ")
        );
    }
    println!(
        "fa4-aot: {} module(s), objects match the manifest",
        modules.len()
    );
    Ok(())
}

/// Every module of the manifest checked (the CI check `fa4-aot`).
pub fn check_all(project: &Project) -> Result<()> {
    let manifest = Manifest::load(&Manifest::path(project))?;
    let all: Vec<&Module> = manifest.modules.iter().collect();
    check(project, &manifest, &all)
}

pub fn run(sh: &Shell, project: &Project, args: Fa4AotArgs) -> Result<()> {
    let path = Manifest::path(project);
    let mut manifest = Manifest::load(&path)?;
    let selected: Vec<Module> = manifest
        .select(&args.arch, &args.module)?
        .into_iter()
        .cloned()
        .collect();
    if args.check {
        return check(project, &manifest, &selected.iter().collect::<Vec<_>>());
    }

    let python = venv(sh, project, &manifest.toolchain)?;
    let generator = project.root.join("fa4_aot").join("generate.py");
    let archs: BTreeSet<&str> = selected.iter().map(|m| m.arch.as_str()).collect();
    let mut lines = Vec::new();
    for arch in archs {
        let names: Vec<&str> = selected
            .iter()
            .filter(|m| m.arch == arch)
            .map(|m| m.name.as_str())
            .collect();
        let dir = object_dir(&project.root, arch);
        step(format!(
            "compiling {} FA4 module(s) for sm_{arch} into {} (~10-30 s each)",
            names.len(),
            dir.display()
        ));
        let out = cmd!(sh, "{python} {generator} {path} {dir} {arch} {names...}")
            .read()
            .with_context(|| {
                format!(
                    "generating the sm_{arch} modules with {}",
                    generator.display()
                )
            })?;
        lines.extend(out.lines().map(str::to_owned));
    }
    let (mut changed, mut fresh, mut same) = (Vec::new(), Vec::new(), 0);
    for line in lines.iter().filter(|l| l.starts_with('{')) {
        let made: Generated = serde_json::from_str(line)
            .with_context(|| format!("reading the generator's line {line}"))?;
        let module = manifest
            .modules
            .iter_mut()
            .find(|m| m.name == made.name)
            .with_context(|| {
                format!("the generator made {}, which the manifest lacks", made.name)
            })?;
        if module.object_sha256.is_empty() {
            fresh.push(module.name.clone());
        } else if module.object_sha256 != made.o_sha256 || module.header_sha256 != made.h_sha256 {
            changed.push(module.name.clone());
        } else {
            same += 1;
        }
        println!(
            "{:<44} {:>6.1} s  .o {}  .h {}",
            made.name,
            made.seconds,
            &made.o_sha256[..16],
            &made.h_sha256[..16]
        );
        module.object_sha256 = made.o_sha256;
        module.header_sha256 = made.h_sha256;
    }
    manifest.write(&path)?;
    println!("fa4-aot: {same} module(s) reproduced their recorded bytes");
    if !fresh.is_empty() {
        println!(
            "fa4-aot: first generated (hashes recorded): {}",
            fresh.join(", ")
        );
    }
    if !changed.is_empty() {
        println!(
            "fa4-aot: different bytes from the recorded ones (new hashes written; the toolchain or \
             the generator changed): {}",
            changed.join(", ")
        );
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
struct Generated {
    name: String,
    seconds: f64,
    o_sha256: String,
    h_sha256: String,
}

/// The generator's Python: a virtual environment under .xtask/ with the pinned packages, made
/// once (a few GB of wheels; minutes) and remade when the pins change.
fn venv(sh: &Shell, project: &Project, toolchain: &Toolchain) -> Result<PathBuf> {
    let dir = project.work().join("fa4-venv");
    let python = dir.join("bin").join("python");
    let stamp = dir.join(".packages");
    let want = toolchain.packages.join("\n");
    if python.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(python);
    }
    let system = which::which("python3").context(
        "fa4-aot needs python3 (3.11 or newer, with venv and pip) to make its virtual environment",
    )?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    step(format!(
        "making {} with {} (pip; ~3 GB of wheels, a few minutes)",
        dir.display(),
        toolchain.packages.join(" ")
    ));
    cmd!(sh, "{system} -m venv {dir}")
        .run()
        .context("python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)")?;
    let packages = &toolchain.packages;
    cmd!(
        sh,
        "{python} -m pip install --disable-pip-version-check --progress-bar off {packages...}"
    )
    .run()
    .context("installing the generator's packages with pip")?;
    std::fs::write(&stamp, want).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str, arch: &str) -> Module {
        Module {
            name: name.into(),
            arch: arch.into(),
            dtype: "f16".into(),
            head_dim: 128,
            qhead_per_kvhead: 8,
            causal: true,
            used_by: "test".into(),
            object_sha256: String::new(),
            header_sha256: String::new(),
        }
    }

    fn manifest(modules: Vec<Module>) -> Manifest {
        Manifest {
            toolchain: Toolchain {
                packages: vec!["flash-attn-4==4.0.0b36".into()],
            },
            modules,
        }
    }

    #[test]
    fn the_manifest_round_trips_and_refuses_what_cannot_be_built() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.toml");
        let mut m = manifest(vec![module("a_hd128", "90a"), module("b_hd64", "90a")]);
        m.modules[1].head_dim = 64;
        m.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# FlashAttention-4"), "{text}");
        assert_eq!(Manifest::load(&path).unwrap(), m);

        for (bad, why) in [
            (
                Box::new(|m: &mut Manifest| m.modules[1].name = "a_hd128".into())
                    as Box<dyn Fn(&mut Manifest)>,
                "twice",
            ),
            (
                Box::new(|m: &mut Manifest| m.modules[0].name = "a-b".into()),
                "C identifier",
            ),
            (
                Box::new(|m: &mut Manifest| m.modules[0].dtype = "f32".into()),
                "dtype",
            ),
            (
                Box::new(|m: &mut Manifest| m.modules[0].head_dim = 100),
                "head_dim",
            ),
            (
                Box::new(|m: &mut Manifest| m.modules[0].qhead_per_kvhead = 0),
                "qhead_per_kvhead",
            ),
            (
                Box::new(|m: &mut Manifest| m.toolchain.packages.push("torch".into())),
                "not pinned",
            ),
        ] {
            let mut broken = m.clone();
            bad(&mut broken);
            broken.write(&path).unwrap();
            let err = format!("{:#}", Manifest::load(&path).unwrap_err());
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn selection_by_arch_and_name_names_what_matches_nothing() {
        let m = manifest(vec![
            module("a", "90a"),
            module("b", "100a"),
            module("c", "90a"),
        ]);
        let names = |v: Vec<&Module>| v.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(m.select(&[], &[]).unwrap()), ["a", "b", "c"]);
        assert_eq!(names(m.select(&["90a".into()], &[]).unwrap()), ["a", "c"]);
        assert_eq!(names(m.select(&[], &["b".into()]).unwrap()), ["b"]);
        assert!(format!("{}", m.select(&["120a".into()], &[]).unwrap_err()).contains("120a"));
        assert!(format!("{}", m.select(&[], &["d".into()]).unwrap_err()).contains("no module d"));
    }

    #[test]
    fn check_finds_missing_changed_unrecorded_and_stray_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = object_dir(root.path(), "90a");
        std::fs::create_dir_all(&dir).unwrap();
        let mut m = manifest(vec![
            module("good", "90a"),
            module("bad", "90a"),
            module("gone", "90a"),
            module("new", "90a"),
        ]);
        for name in ["good", "bad"] {
            std::fs::write(dir.join(format!("{name}.o")), format!("{name} object")).unwrap();
            std::fs::write(dir.join(format!("{name}.h")), format!("{name} header")).unwrap();
        }
        std::fs::write(dir.join("stray.o"), "?").unwrap();
        let sha = |s: &str| format!("{:x}", Sha256::digest(s.as_bytes()));
        for (i, name) in ["good", "bad", "gone"].iter().enumerate() {
            m.modules[i].object_sha256 = sha(&format!("{name} object"));
            m.modules[i].header_sha256 = sha(&format!("{name} header"));
        }
        m.modules[1].object_sha256 = sha("an older object");
        let all: Vec<&Module> = m.modules.iter().collect();
        let problems = check_objects(root.path(), &m, &all).unwrap();
        let has = |needle: &str| problems.iter().any(|p| p.contains(needle));
        assert!(has("bad: ") && has("the manifest says"), "{problems:?}");
        assert!(has("gone: ") && has("missing"), "{problems:?}");
        assert!(has("new: no sha256 recorded"), "{problems:?}");
        assert!(has("stray.o belongs to no module"), "{problems:?}");
        assert!(
            !problems.iter().any(|p| p.starts_with("good")),
            "{problems:?}"
        );
        // bad (.o), gone (.o, .h), new (.o, .h), stray
        assert_eq!(problems.len(), 6, "{problems:?}");
        // Only the good module: nothing wrong but the stray file.
        let good = check_objects(root.path(), &m, &all[..1]).unwrap();
        assert_eq!(good.len(), 1, "{good:?}");
    }
}
