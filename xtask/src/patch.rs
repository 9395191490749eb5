//! `cargo xtask patch apply|check|export`, and the patched working tree that builds use.
//!
//! The working tree .xtask/hosts/<host>/src is a git repository: one commit holding the pristine
//! tree (tagged `flashrt-pristine`, identical on every machine) and one commit per patch of the
//! series, applied with `git am` (exact context, no fuzz). The overlay is mounted as a symlink
//! that the repository ignores. Developers edit and commit in that tree, then `patch export`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use xshell::{cmd, Shell};

use crate::config::HostConfig;
use crate::host::{self, HostSelect, PristineStamp, SourceArgs};
use crate::project::{note, read_stamp, step, write_atomic, write_stamp, Project};
use crate::{fsutil, treehash};

#[derive(Debug, Args)]
pub struct PatchArgs {
    #[command(subcommand)]
    pub command: PatchCommand,
}

#[derive(Debug, Subcommand)]
pub enum PatchCommand {
    /// Apply the series to the working tree (from the pristine pin) and mount the overlay.
    Apply {
        #[command(flatten)]
        source: SourceArgs,
        /// Discard local edits and unexported commits in the working tree.
        #[arg(long)]
        force: bool,
    },
    /// Apply the series to a scratch copy of the pin, export it, and require the result to equal
    /// the committed series byte for byte.
    Check(SourceArgs),
    /// Write the working tree's commits over the pristine pin back to patches/<host>/.
    Export {
        #[command(flatten)]
        select: HostSelect,
        /// Export even though the working tree has uncommitted changes (they are not exported).
        #[arg(long)]
        force: bool,
    },
}

/// Tag of the pristine commit in every working tree.
const PRISTINE_TAG: &str = "flashrt-pristine";

/// format-patch flags that make the output depend on the commits alone.
const FORMAT_PATCH_FLAGS: [&str; 7] = [
    "--no-stat",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--no-numbered",
    "--no-renames",
    "--subject-prefix=PATCH",
];

pub fn run(sh: &Shell, project: &Project, args: PatchArgs) -> Result<()> {
    match args.command {
        PatchCommand::Apply { source, force } => {
            let host = project.host(&source.select.host)?;
            let tree = ensure_patched(sh, project, &host, source.host_src.as_deref(), force)?;
            println!("patched tree: {}", tree.display());
            Ok(())
        }
        PatchCommand::Check(source) => {
            let host = project.host(&source.select.host)?;
            check(sh, project, &host, source.host_src.as_deref())
        }
        PatchCommand::Export { select, force } => {
            export(sh, project, &project.host(&select.host)?, force)
        }
    }
}

/// The ordered patch list of a host.
#[derive(Debug, Clone)]
pub struct Series {
    pub dir: PathBuf,
    pub patches: Vec<String>,
    /// Changes whenever the series file or any patch changes.
    pub digest: String,
}

pub fn load_series(project: &Project, host: &str) -> Result<Series> {
    let dir = project.patches_dir(host);
    let series_file = dir.join("series");
    if !series_file.is_file() {
        bail!(
            "no patch series for host {host}: {} is missing (the overlay has not been ported to this host yet)",
            series_file.display()
        );
    }
    let text = std::fs::read_to_string(&series_file)
        .with_context(|| format!("reading {}", series_file.display()))?;
    let mut hasher = Sha256::new();
    let mut patches = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let path = dir.join(line);
        let bytes = std::fs::read(&path).with_context(|| {
            format!(
                "{} lists {line}, which cannot be read",
                series_file.display()
            )
        })?;
        hasher.update(line.as_bytes());
        hasher.update([0]);
        hasher.update(&bytes);
        patches.push(line.to_owned());
    }
    Ok(Series {
        dir,
        patches,
        digest: treehash::hex(&hasher.finalize()),
    })
}

/// Recorded next to the working tree.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TreeStamp {
    /// Tree hash of the pristine tree the working tree was made from.
    pristine: String,
    /// Digest of the series last applied completely; None while an apply is under way.
    series: Option<String>,
    /// HEAD after that apply.
    head: Option<String>,
}

fn tree_stamp_path(project: &Project, host: &str) -> PathBuf {
    project.host_work(host).join("src.json")
}

/// A git command in `dir`, isolated from the user's git configuration so that commits and
/// exported patches are the same on every machine.
fn git<'a>(sh: &'a Shell, dir: &Path) -> xshell::Cmd<'a> {
    cmd!(sh, "git -C {dir} -c user.name=FlashRT-xtask -c user.email=xtask@flashrt.invalid -c commit.gpgsign=false -c core.autocrlf=false -c core.fileMode=true")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .quiet()
}

/// Makes `dest` a git repository whose single commit (tagged flashrt-pristine) is `src`.
fn init_tree_repo(sh: &Shell, src: &Path, dest: &Path, mount: &str) -> Result<()> {
    step(format!("creating the working tree from {}", src.display()));
    fsutil::copy_tree(src, dest, &|_| false)?;
    git(sh, dest).args(["init", "-q", "-b", "main"]).run()?;
    git(sh, dest).args(["add", "-A", "-f"]).run()?;
    // Fixed identity and dates: the pristine commit has the same id on every machine.
    git(sh, dest)
        .args(["commit", "-q", "--no-verify", "-m", "pristine pinned tree"])
        .env("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z")
        .run()
        .context("committing the pristine tree")?;
    git(sh, dest).args(["tag", PRISTINE_TAG]).run()?;
    let exclude = dest.join(".git/info/exclude");
    write_atomic(
        &exclude,
        format!("# the FlashRT overlay mount\n/{mount}\n").as_bytes(),
    )?;
    Ok(())
}

/// Applies every patch of `series` on top of the pristine commit. On failure the tree is put back
/// to the pristine commit and the error names the patch and the hunks that failed.
fn apply_series(sh: &Shell, tree: &Path, series: &Series) -> Result<String> {
    git(sh, tree)
        .args(["reset", "-q", "--hard", PRISTINE_TAG])
        .run()?;
    for name in &series.patches {
        let patch = series.dir.join(name);
        let out = git(sh, tree)
            .args(["am", "-q", "--committer-date-is-author-date"])
            .arg(&patch)
            .ignore_status()
            .output()?;
        if !out.status.success() {
            let _ = git(sh, tree)
                .args(["am", "--abort"])
                .ignore_status()
                .output();
            git(sh, tree)
                .args(["reset", "-q", "--hard", PRISTINE_TAG])
                .run()?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let hunks: Vec<&str> = stderr
                .lines()
                .chain(stdout.lines())
                .filter(|l| l.starts_with("error:") || l.contains("patch does not apply"))
                .collect();
            bail!(
                "patch {name} does not apply to the pinned tree:\n  {}\nThe working tree was left pristine. \
                 Update the patch for this pin (edit {}, commit, `cargo xtask patch export`).",
                if hunks.is_empty() { stderr.trim().to_owned() } else { hunks.join("\n  ") },
                tree.display()
            );
        }
    }
    head(sh, tree)
}

fn head(sh: &Shell, tree: &Path) -> Result<String> {
    Ok(git(sh, tree)
        .args(["rev-parse", "HEAD"])
        .read()?
        .trim()
        .to_owned())
}

/// Uncommitted changes in the working tree (tracked and untracked files), as `git status` lines.
fn local_edits(sh: &Shell, tree: &Path) -> Result<Vec<String>> {
    let out = git(sh, tree)
        .args(["status", "--porcelain", "--untracked-files=all"])
        .read()?;
    Ok(out
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect())
}

fn refuse_edits(tree: &Path, edits: &[String]) -> Result<()> {
    if edits.is_empty() {
        return Ok(());
    }
    bail!(
        "the working tree {} has local edits:\n  {}\nCommit them and run `cargo xtask patch export` to keep them, \
         or pass --force to discard them.",
        tree.display(),
        edits.join("\n  ")
    )
}

/// The patched working tree for `host`, created or brought up to date with the series, with the
/// overlay mounted. Does nothing when the tree already matches.
pub fn ensure_patched(
    sh: &Shell,
    project: &Project,
    host: &HostConfig,
    host_src: Option<&Path>,
    force: bool,
) -> Result<PathBuf> {
    let series = load_series(project, &host.name)?;
    let pristine = host::ensure_pristine(sh, project, host, host_src)?;
    let tree = project.tree_dir(&host.name);
    let stamp_path = tree_stamp_path(project, &host.name);
    let mut stamp: Option<TreeStamp> = read_stamp(&stamp_path);

    let base_matches = tree.join(".git").is_dir()
        && stamp
            .as_ref()
            .is_some_and(|s| s.pristine == pristine.tree_hash);
    if !base_matches {
        if tree.join(".git").is_dir() && !force {
            refuse_edits(&tree, &local_edits(sh, &tree)?)?;
        }
        recreate_tree(sh, project, host, &pristine)?;
        stamp = None;
    }
    let mut stamp = stamp.unwrap_or(TreeStamp {
        pristine: pristine.tree_hash.clone(),
        ..TreeStamp::default()
    });

    if tree.join(".git/rebase-apply").exists() {
        // An apply of ours was interrupted.
        let _ = git(sh, &tree)
            .args(["am", "--abort"])
            .ignore_status()
            .output();
    }
    let edits = local_edits(sh, &tree)?;
    let current_head = head(sh, &tree)?;
    let up_to_date = stamp.series.as_deref() == Some(series.digest.as_str())
        && stamp.head.as_deref() == Some(current_head.as_str())
        && edits.is_empty();
    if !up_to_date {
        if !force {
            refuse_edits(&tree, &edits)?;
            if let (Some(_), Some(applied)) = (&stamp.series, &stamp.head) {
                if applied != &current_head {
                    bail!(
                        "the working tree {} has commits that are not in the series (HEAD {current_head}, \
                         series applied as {applied}).\nRun `cargo xtask patch export --host {}` to keep them, \
                         or pass --force to discard them.",
                        tree.display(),
                        host.name
                    );
                }
            }
        }
        step(format!(
            "applying {} patch(es) from {}",
            series.patches.len(),
            series.dir.display()
        ));
        stamp.series = None;
        stamp.head = None;
        write_stamp(&stamp_path, &stamp)?;
        let new_head = apply_series(sh, &tree, &series)?;
        stamp.series = Some(series.digest.clone());
        stamp.head = Some(new_head);
        write_stamp(&stamp_path, &stamp)?;
    }
    mount(project, host, &tree)?;
    Ok(tree)
}

fn recreate_tree(
    sh: &Shell,
    project: &Project,
    host: &HostConfig,
    pristine: &PristineStamp,
) -> Result<()> {
    let scratch = project.scratch()?;
    let staged = scratch.path().join("src");
    init_tree_repo(sh, &project.pristine_dir(&host.name), &staged, &host.mount)?;
    let stamp_path = tree_stamp_path(project, &host.name);
    if stamp_path.exists() {
        std::fs::remove_file(&stamp_path)?;
    }
    fsutil::replace_dir(&staged, &project.tree_dir(&host.name))?;
    write_stamp(
        &stamp_path,
        &TreeStamp {
            pristine: pristine.tree_hash.clone(),
            ..TreeStamp::default()
        },
    )
}

/// The overlay mount: a symlink at `host.mount` pointing to this checkout's overlay/.
fn mount(project: &Project, host: &HostConfig, tree: &Path) -> Result<()> {
    let at = tree.join(&host.mount);
    let target = project.overlay_dir();
    match std::fs::symlink_metadata(&at) {
        Ok(meta) if meta.file_type().is_symlink() => {
            if std::fs::read_link(&at)? == target {
                return Ok(());
            }
            std::fs::remove_file(&at)?;
        }
        Ok(_) => bail!(
            "{} exists in the host tree and is not the overlay mount; remove it or run `cargo xtask patch apply --force`",
            at.display()
        ),
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&target, &at)
        .with_context(|| format!("mounting {} at {}", target.display(), at.display()))?;
    note(format!(
        "overlay mounted at {} -> {}",
        host.mount,
        target.display()
    ));
    Ok(())
}

/// Exports `tree`'s commits over the pristine tag into `out`, with a series file.
fn format_patches(sh: &Shell, tree: &Path, out: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(out)?;
    let range = format!("{PRISTINE_TAG}..HEAD");
    let listing = git(sh, tree)
        .arg("format-patch")
        .args(FORMAT_PATCH_FLAGS)
        .arg("-o")
        .arg(out)
        .arg(range)
        .read()?;
    let names: Vec<String> = listing
        .lines()
        .filter_map(|l| {
            Path::new(l.trim())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .collect();
    let mut series = names.join("\n");
    if !series.is_empty() {
        series.push('\n');
    }
    std::fs::write(out.join("series"), series)?;
    Ok(names)
}

fn export(sh: &Shell, project: &Project, host: &HostConfig, force: bool) -> Result<()> {
    let tree = project.tree_dir(&host.name);
    let stamp_path = tree_stamp_path(project, &host.name);
    let Some(mut stamp) =
        read_stamp::<TreeStamp>(&stamp_path).filter(|_| tree.join(".git").is_dir())
    else {
        bail!(
            "no working tree for {} yet: run `cargo xtask patch apply --host {}` first",
            host.name,
            host.name
        );
    };
    let edits = local_edits(sh, &tree)?;
    if !edits.is_empty() {
        if !force {
            bail!(
                "the working tree {} has uncommitted changes:\n  {}\nexport takes commits only: commit them \
                 (git -C {} commit -a), or pass --force to export without them.",
                tree.display(),
                edits.join("\n  "),
                tree.display()
            );
        }
        note("exporting commits only; uncommitted changes stay in the working tree");
    }
    let scratch = project.scratch()?;
    let out = scratch.path().join("patches");
    let names = format_patches(sh, &tree, &out)?;

    let dir = project.patches_dir(&host.name);
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".patch") && !names.contains(&name) {
            std::fs::remove_file(&path)?;
            println!("removed   {name}");
        }
    }
    for name in names.iter().map(String::as_str).chain(["series"]) {
        let new = std::fs::read(out.join(name))?;
        let old = std::fs::read(dir.join(name)).ok();
        if old.as_deref() != Some(new.as_slice()) {
            write_atomic(&dir.join(name), &new)?;
            println!(
                "{} {name}",
                if old.is_some() {
                    "updated  "
                } else {
                    "added    "
                }
            );
        }
    }
    // The tree now is what the series describes: a build need not re-apply it.
    let series = load_series(project, &host.name)?;
    stamp.series = Some(series.digest);
    stamp.head = Some(head(sh, &tree)?);
    write_stamp(&stamp_path, &stamp)?;
    println!("{} patch(es) in {}", names.len(), dir.display());
    Ok(())
}

/// Apply at the pin in scratch space, export, compare with the committed series.
pub fn check(
    sh: &Shell,
    project: &Project,
    host: &HostConfig,
    host_src: Option<&Path>,
) -> Result<()> {
    let series = load_series(project, &host.name)?;
    host::ensure_pristine(sh, project, host, host_src)?;
    let scratch = project.scratch()?;
    let tree = scratch.path().join("src");
    init_tree_repo(sh, &project.pristine_dir(&host.name), &tree, &host.mount)?;
    step(format!("applying {} patch(es)", series.patches.len()));
    apply_series(sh, &tree, &series)?;
    let out = scratch.path().join("export");
    let names = format_patches(sh, &tree, &out)?;

    let mut problems = Vec::new();
    let mut expected: Vec<String> = series.patches.clone();
    expected.push("series".into());
    let mut exported = names.clone();
    exported.push("series".into());
    for name in &exported {
        match std::fs::read(series.dir.join(name)) {
            Err(_) => problems.push(format!("{name}: exported but not committed")),
            Ok(committed) if committed != std::fs::read(out.join(name))? => {
                problems.push(format!("{name}: differs from the export"))
            }
            Ok(_) => {}
        }
    }
    for name in expected.iter().filter(|n| !exported.contains(n)) {
        problems.push(format!("{name}: committed but not produced by the export"));
    }
    if !problems.is_empty() {
        bail!(
            "patch series for {} does not reproduce byte for byte:\n  {}\nRegenerate it: `cargo xtask patch apply \
             --host {}` then `cargo xtask patch export --host {}`.",
            host.name,
            problems.join("\n  "),
            host.name,
            host.name
        );
    }
    println!(
        "patch series for {} reproduces byte for byte ({} patches)",
        host.name,
        names.len()
    );
    Ok(())
}

/// Working-tree lines of `cargo xtask host status`.
pub fn print_tree_status(sh: &Shell, project: &Project, host: &HostConfig) -> Result<()> {
    let tree = project.tree_dir(&host.name);
    let stamp: Option<TreeStamp> = read_stamp(&tree_stamp_path(project, &host.name));
    let series = load_series(project, &host.name);
    let (Some(stamp), true) = (stamp, tree.join(".git").is_dir()) else {
        println!(
            "patches   working tree not created (cargo xtask patch apply --host {})",
            host.name
        );
        return Ok(());
    };
    println!("tree      {}", tree.display());
    let current_head = head(sh, &tree)?;
    let state = match (&series, &stamp.series) {
        (Err(err), _) => format!("{err:#}"),
        (Ok(_), None) => "not applied (an apply was interrupted or never ran)".to_owned(),
        (Ok(s), Some(applied)) if applied != &s.digest => {
            "out of date with patches/ (run patch apply)".to_owned()
        }
        (Ok(s), Some(_)) if stamp.head.as_deref() != Some(current_head.as_str()) => {
            format!(
                "{} patch(es) applied, plus commits not exported (run patch export)",
                s.patches.len()
            )
        }
        (Ok(s), Some(_)) => format!("{} patch(es) applied, up to date", s.patches.len()),
    };
    println!("patches   {state}");
    let edits = local_edits(sh, &tree)?;
    if edits.is_empty() {
        println!("edits     none");
    } else {
        println!("edits     {}", edits.join("\n          "));
    }
    let at = tree.join(&host.mount);
    let mount_state = match std::fs::read_link(&at) {
        Ok(target) if target == project.overlay_dir() => {
            format!("{} -> {}", host.mount, target.display())
        }
        Ok(target) => format!(
            "{} -> {} (stale: patch apply fixes it)",
            host.mount,
            target.display()
        ),
        Err(_) => format!("{} not mounted (patch apply mounts it)", host.mount),
    };
    println!("mount     {mount_state}");
    Ok(())
}
