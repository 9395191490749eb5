//! `cargo xtask patch apply|check|export`, and the patched working tree that builds use.
//!
//! The working tree .xtask/hosts/<host>/src is a git repository: one commit holding the pristine
//! tree (tagged `flashrt-pristine`, identical on every machine) and one commit per patch of the
//! series, applied with `git am` (exact context, no fuzz). The overlay is mounted as a symlink
//! that the repository ignores. Developers edit and commit in that tree, then `patch export`.
//!
//! A patch that does not apply stops the apply the way `git am --3way` does: the patches before it
//! stay committed, it is left in the tree as a 3-way merge (conflicted or not) or as .rej files,
//! and the stop is recorded in the stamp until `patch apply --continue` commits the resolution and
//! applies the rest, or `--abort` returns to the pristine commit. Export refuses to write a series
//! it has not seen complete in the tree, so a stopped or abandoned apply never shrinks patches/.

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
        /// Discard local edits, unexported commits and a stopped apply in the working tree.
        #[arg(long, conflicts_with_all = ["continue_stopped", "abort_stopped"])]
        force: bool,
        /// After an apply stopped at a patch: commit the staged resolution (or take the commit
        /// made by hand) and apply the rest of the series.
        #[arg(long = "continue", conflicts_with_all = ["abort_stopped", "host_src"])]
        continue_stopped: bool,
        /// After an apply stopped at a patch: discard it and return to the pristine commit.
        #[arg(long = "abort", conflicts_with = "host_src")]
        abort_stopped: bool,
    },
    /// Apply the series to a scratch copy of the pin, export it, and require the result to equal
    /// the committed series byte for byte.
    Check(SourceArgs),
    /// Write the working tree's commits over the pristine pin back to patches/<host>/. Refuses
    /// while the tree may not hold the whole series (an apply stopped, aborted or never
    /// completed, patches/ changed since, fewer commits than patches) and while it has
    /// uncommitted changes.
    Export {
        #[command(flatten)]
        select: HostSelect,
        /// Export the tree's commits even where that drops patches of the series (it names them).
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
        PatchCommand::Apply {
            source,
            force,
            continue_stopped,
            abort_stopped,
        } => {
            let host = project.host(&source.select.host)?;
            if abort_stopped {
                return abort_apply(sh, project, &host);
            }
            let tree = if continue_stopped {
                continue_apply(sh, project, &host)?
            } else {
                ensure_patched(sh, project, &host, source.host_src.as_deref(), force)?
            };
            println!("patched tree: {}", tree.display());
            Ok(())
        }
        PatchCommand::Check(source) => {
            let host = project.host(&source.select.host)?;
            check(sh, project, &host, source.host_src.as_deref())
        }
        PatchCommand::Export { select, force } => {
            let host = project.host(&select.host)?;
            let exported = export(sh, project, &host, force)?;
            for name in &exported.dropped {
                println!("dropped   {name} (--force: it was not in the working tree)");
            }
            println!(
                "{} patch(es) in {}",
                exported.patches.len(),
                project.patches_dir(&host.name).display()
            );
            Ok(())
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
    /// Digest of the series the tree last held completely (applied, continued or exported); None
    /// while an apply is under way or stopped, and after one was aborted.
    series: Option<String>,
    /// HEAD at that point.
    head: Option<String>,
    /// Patches of that series that were resolved by hand (`apply --continue`): the tree differs
    /// from patches/ until it is exported.
    #[serde(default)]
    resolved: Vec<String>,
    /// An apply that stopped at a patch that does not apply, until `--continue` or `--abort`.
    #[serde(default)]
    stopped: Option<StoppedApply>,
}

/// Where an apply stopped, so that `--continue` can finish it and export can tell what is missing.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoppedApply {
    /// Digest of the series being applied.
    series: String,
    /// Its patches, in order.
    patches: Vec<String>,
    /// Index in `patches` of the patch that did not apply.
    failed: usize,
    /// HEAD with the patches before it committed.
    base: String,
    /// What the failed patch left in the tree, in words.
    left: String,
    /// Patches before it resolved by hand at earlier stops of the same apply.
    resolved: Vec<String>,
}

impl StoppedApply {
    fn failed_patch(&self) -> &str {
        &self.patches[self.failed]
    }

    fn not_applied(&self) -> &[String] {
        &self.patches[self.failed + 1..]
    }

    /// "patch NAME (i of n), left as ...".
    fn summary(&self) -> String {
        format!(
            "patch {} ({} of {}), left as {}",
            self.failed_patch(),
            self.failed + 1,
            self.patches.len(),
            self.left
        )
    }
}

fn tree_stamp_path(project: &Project, host: &str) -> PathBuf {
    project.host_work(host).join("src.json")
}

/// The working tree's stamp, if the tree exists.
fn read_tree_stamp(project: &Project, host: &str) -> Option<TreeStamp> {
    read_stamp(&tree_stamp_path(project, host))
        .filter(|_| project.tree_dir(host).join(".git").is_dir())
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

/// How applying a series ended.
enum Applied {
    /// Every patch is committed; the HEAD.
    Complete(String),
    /// A patch did not apply; the ones before it are committed.
    Stopped(Stop),
}

/// A patch that did not apply as written.
struct Stop {
    /// Its index in the series.
    index: usize,
    /// git's error lines: the files and hunks that failed.
    errors: String,
    left: Left,
}

/// What a patch that did not apply left in the working tree.
enum Left {
    /// Nothing: its `git am` was aborted (scratch trees, where nobody resolves anything).
    Nothing,
    /// A 3-way merge without conflicts, staged: the patch's context had changed.
    Merged,
    /// A 3-way merge with conflict markers in these files.
    Conflicts(Vec<String>),
    /// No 3-way merge was possible: the hunks that fit are applied, the others are in these
    /// .rej files.
    Rejects(Vec<String>),
    /// Neither a 3-way merge nor any hunk applied (e.g. the patch file is malformed).
    Unapplied,
}

impl Left {
    fn describe(&self) -> String {
        match self {
            Left::Nothing => "nothing (aborted)".to_owned(),
            Left::Merged => "a 3-way merge without conflicts, staged for review".to_owned(),
            Left::Conflicts(files) => format!("a 3-way conflict in {}", files.join(", ")),
            Left::Rejects(files) if files.is_empty() => {
                "its hunks applied, unstaged, none rejected".to_owned()
            }
            Left::Rejects(files) => format!("rejected hunks in {}", files.join(", ")),
            Left::Unapplied => {
                "a `git am` session with nothing applied (git could use none of it)".to_owned()
            }
        }
    }

    /// The first thing to do about it, as a command line with a comment.
    fn next_step(&self, tree: &Path) -> String {
        let tree = tree.display();
        match self {
            Left::Nothing => String::new(),
            Left::Merged => format!("git -C {tree} diff --cached   # review the merge (staged)"),
            Left::Conflicts(files) => {
                format!(
                    "git -C {tree} add {}   # after fixing the conflict markers",
                    files.join(" ")
                )
            }
            Left::Rejects(_) => format!(
                "git -C {tree} add <files>   # after applying the .rej hunks by hand and deleting the .rej files"
            ),
            Left::Unapplied => format!(
                "git -C {tree} add <files>   # after making the patch's change by hand (git -C {tree} am --show-current-patch=diff shows it)"
            ),
        }
    }
}

/// What to do with a patch that does not apply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnFailure {
    /// Abort its `git am`: HEAD holds the patches before it.
    Abort,
    /// Leave it in the tree for the user to resolve, inside the `git am` session.
    LeaveForResolution,
}

/// Applies the patches of `series` from index `from` on, on top of HEAD, each exactly (`git am`,
/// no fuzz). At the first that does not apply, stops as `on_failure` says.
fn apply_patches(
    sh: &Shell,
    tree: &Path,
    series: &Series,
    from: usize,
    on_failure: OnFailure,
) -> Result<Applied> {
    for (index, name) in series.patches.iter().enumerate().skip(from) {
        let patch = series.dir.join(name);
        let out = git(sh, tree)
            .args(["am", "-q", "--committer-date-is-author-date"])
            .arg(&patch)
            .ignore_status()
            .output()
            .with_context(|| format!("running git am on {}", patch.display()))?;
        if out.status.success() {
            continue;
        }
        let errors = failure_lines(&out);
        let left = match on_failure {
            OnFailure::Abort => {
                git(sh, tree)
                    .args(["am", "--abort"])
                    .ignore_status()
                    .output()?;
                Left::Nothing
            }
            OnFailure::LeaveForResolution => leave_for_resolution(sh, tree, &patch)?,
        };
        return Ok(Applied::Stopped(Stop {
            index,
            errors,
            left,
        }));
    }
    Ok(Applied::Complete(head(sh, tree)?))
}

/// git's lines that say which file and hunk failed (the whole stderr if none match).
fn failure_lines(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let hunks: Vec<&str> = stderr
        .lines()
        .chain(stdout.lines())
        .filter(|l| l.starts_with("error:") || l.contains("patch does not apply"))
        .collect();
    if hunks.is_empty() {
        stderr.trim().to_owned()
    } else {
        hunks.join("\n  ")
    }
}

/// After `git am` stopped at `patch` (tree untouched, session open): the patch as a 3-way merge
/// where its preimage blobs are in the repository, else hunk by hunk with .rej files, as
/// `git am --3way` and `git apply --reject` would leave it.
fn leave_for_resolution(sh: &Shell, tree: &Path, patch: &Path) -> Result<Left> {
    let merged = git(sh, tree)
        .args(["apply", "--3way"])
        .arg(patch)
        .ignore_status()
        .output()?;
    if merged.status.success() {
        return Ok(Left::Merged);
    }
    let conflicts = unmerged_paths(sh, tree)?;
    if !conflicts.is_empty() {
        return Ok(Left::Conflicts(conflicts));
    }
    // No merge base (the preimage blobs are missing, or the patch does not fit them): git
    // changed nothing, so apply what fits.
    git(sh, tree)
        .args(["apply", "--reject"])
        .arg(patch)
        .ignore_status()
        .output()?;
    let rejects: Vec<String> = git(sh, tree)
        .args(["ls-files", "--others", "--exclude-standard"])
        .read()?
        .lines()
        .filter(|l| l.ends_with(".rej"))
        .map(str::to_owned)
        .collect();
    if rejects.is_empty() && local_edits(sh, tree)?.is_empty() {
        return Ok(Left::Unapplied);
    }
    Ok(Left::Rejects(rejects))
}

/// Files with unresolved merge conflicts.
fn unmerged_paths(sh: &Shell, tree: &Path) -> Result<Vec<String>> {
    Ok(git(sh, tree)
        .args(["diff", "--name-only", "--diff-filter=U"])
        .read()?
        .lines()
        .map(str::to_owned)
        .collect())
}

fn am_in_progress(tree: &Path) -> bool {
    tree.join(".git/rebase-apply").exists()
}

/// Puts the tree at the pristine commit: any `git am` session, local edit and untracked file goes.
fn reset_to_pristine(sh: &Shell, tree: &Path) -> Result<()> {
    if am_in_progress(tree) {
        git(sh, tree)
            .args(["am", "--abort"])
            .ignore_status()
            .output()?;
    }
    git(sh, tree)
        .args(["reset", "-q", "--hard", PRISTINE_TAG])
        .run()?;
    // Ignored files (the overlay mount) stay.
    git(sh, tree).args(["clean", "-q", "-f", "-d"]).run()?;
    Ok(())
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

/// Refuses when the tree holds work that patches/ lacks: a stopped apply, patches resolved by
/// hand, or commits made since the last apply or export.
fn refuse_unexported(tree: &Path, host: &str, stamp: &TreeStamp, current_head: &str) -> Result<()> {
    if let Some(stop) = &stamp.stopped {
        bail!(
            "the working tree {} is in the middle of an apply: {}.\nFinish it (resolve, `git add`, \
             `cargo xtask patch apply --host {host} --continue`, then `cargo xtask patch export --host {host}`), \
             abandon it (`cargo xtask patch apply --host {host} --abort`), or pass --force to discard it and \
             apply the series again.",
            tree.display(),
            stop.summary()
        );
    }
    if !stamp.resolved.is_empty() {
        bail!(
            "the working tree {} holds {} as resolved by hand, not yet exported to patches/{host}.\n\
             Run `cargo xtask patch export --host {host}` to keep the resolution, or pass --force to discard it.",
            tree.display(),
            stamp.resolved.join(", ")
        );
    }
    if let (Some(_), Some(applied)) = (&stamp.series, &stamp.head) {
        if applied != current_head {
            bail!(
                "the working tree {} has commits that are not in the series (HEAD {current_head}, \
                 series applied as {applied}).\nRun `cargo xtask patch export --host {host}` to keep them, \
                 or pass --force to discard them.",
                tree.display()
            );
        }
    }
    Ok(())
}

/// The patched working tree for `host`, created or brought up to date with the series, with the
/// overlay mounted. Does nothing when the tree already matches. A patch that does not apply stops
/// the apply for resolution (recorded in the stamp) and fails with the commands that go on.
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
    let stamp = read_tree_stamp(project, &host.name);
    let has_repo = tree.join(".git").is_dir();

    if has_repo && am_in_progress(&tree) && stamp.as_ref().is_none_or(|s| s.stopped.is_none()) {
        // An apply of ours was interrupted before it could record a stop.
        git(sh, &tree)
            .args(["am", "--abort"])
            .ignore_status()
            .output()?;
    }
    if has_repo && !force {
        if let Some(stamp) = &stamp {
            refuse_unexported(&tree, &host.name, stamp, &head(sh, &tree)?)?;
        }
        refuse_edits(&tree, &local_edits(sh, &tree)?)?;
    }

    let base_matches = stamp
        .as_ref()
        .is_some_and(|s| s.pristine == pristine.tree_hash);
    if !base_matches {
        recreate_tree(sh, project, host, &pristine)?;
    }
    let mut stamp = stamp.filter(|_| base_matches).unwrap_or(TreeStamp {
        pristine: pristine.tree_hash.clone(),
        ..TreeStamp::default()
    });

    let edits = local_edits(sh, &tree)?;
    let current_head = head(sh, &tree)?;
    let up_to_date = stamp.stopped.is_none()
        && stamp.resolved.is_empty()
        && stamp.series.as_deref() == Some(series.digest.as_str())
        && stamp.head.as_deref() == Some(current_head.as_str())
        && edits.is_empty();
    if !up_to_date {
        step(format!(
            "applying {} patch(es) from {}",
            series.patches.len(),
            series.dir.display()
        ));
        stamp = TreeStamp {
            pristine: stamp.pristine,
            ..TreeStamp::default()
        };
        write_stamp(&stamp_path, &stamp)?;
        // Whatever was here was refused above unless --force discards it.
        reset_to_pristine(sh, &tree)?;
        match apply_patches(sh, &tree, &series, 0, OnFailure::LeaveForResolution)? {
            Applied::Complete(new_head) => {
                stamp.series = Some(series.digest.clone());
                stamp.head = Some(new_head);
                write_stamp(&stamp_path, &stamp)?;
            }
            Applied::Stopped(stop) => {
                return Err(record_stop(
                    sh,
                    project,
                    &host.name,
                    &mut stamp,
                    &series,
                    &stop,
                    Vec::new(),
                )?);
            }
        }
    }
    mount(project, host, &tree)?;
    Ok(tree)
}

/// Records a stopped apply in the stamp; returns the error that explains it and what to run next.
fn record_stop(
    sh: &Shell,
    project: &Project,
    host: &str,
    stamp: &mut TreeStamp,
    series: &Series,
    stop: &Stop,
    resolved: Vec<String>,
) -> Result<anyhow::Error> {
    let tree = project.tree_dir(host);
    let stopped = StoppedApply {
        series: series.digest.clone(),
        patches: series.patches.clone(),
        failed: stop.index,
        base: head(sh, &tree)?,
        left: stop.left.describe(),
        resolved,
    };
    stamp.series = None;
    stamp.head = None;
    stamp.resolved.clear();
    stamp.stopped = Some(stopped.clone());
    write_stamp(&tree_stamp_path(project, host), stamp)?;

    let committed = match stopped.failed {
        0 => "It is the first patch: nothing before it is committed.".to_owned(),
        n => format!("Committed before it: {}.", stopped.patches[..n].join(", ")),
    };
    let pending = match stopped.not_applied() {
        [] => String::new(),
        rest => format!("\nNot applied yet: {}.", rest.join(", ")),
    };
    Ok(anyhow::anyhow!(
        "patch {name} ({index} of {total}) does not apply:\n  {errors}\n{committed}{pending}\n\
         It is left in {tree} as {left}. Resolve it there, then:\n  \
         {next}\n  \
         cargo xtask patch apply --host {host} --continue   # commits it with its message, applies the rest\n  \
         cargo xtask patch export --host {host}             # writes the fixed series to patches/{host}/\n\
         Or `cargo xtask patch apply --host {host} --abort` to return to the pristine tree.",
        name = stopped.failed_patch(),
        index = stopped.failed + 1,
        total = stopped.patches.len(),
        errors = stop.errors,
        tree = tree.display(),
        left = stopped.left,
        next = stop.left.next_step(&tree),
    ))
}

/// `patch apply --continue`: commits the resolution of the patch the apply stopped at (or takes
/// the commit the user made), then applies the rest of the series.
pub fn continue_apply(sh: &Shell, project: &Project, host: &HostConfig) -> Result<PathBuf> {
    let h = &host.name;
    let tree = project.tree_dir(h);
    let stamp_path = tree_stamp_path(project, h);
    let Some(mut stamp) = read_tree_stamp(project, h) else {
        bail!("no working tree for {h} yet: run `cargo xtask patch apply --host {h}`");
    };
    let Some(stop) = stamp.stopped.clone() else {
        bail!(
            "no stopped apply to continue in {}: `cargo xtask host status --host {h}` shows its state, \
             `cargo xtask patch apply --host {h}` applies the series",
            tree.display()
        );
    };
    let series = load_series(project, h)?;
    let name = stop.failed_patch().to_owned();
    if series.digest != stop.series {
        bail!(
            "patches/{h} changed since the apply stopped at {name}, so it cannot be continued. \
             Run `cargo xtask patch apply --host {h} --abort`, then `cargo xtask patch apply --host {h}`."
        );
    }
    let conflicts = unmerged_paths(sh, &tree)?;
    if !conflicts.is_empty() {
        bail!(
            "{name} still has conflicts in:\n  {}\nFix them, `git -C {} add` the files, then run \
             `cargo xtask patch apply --host {h} --continue` again.",
            conflicts.join("\n  "),
            tree.display()
        );
    }
    let edits = local_edits(sh, &tree)?;
    let unstaged: Vec<&String> = edits
        .iter()
        .filter(|l| l.starts_with("??") || l.as_bytes().get(1).is_some_and(|&c| c != b' '))
        .collect();
    if !unstaged.is_empty() {
        bail!(
            "the working tree {} has changes that are not staged:\n  {}\n--continue commits what is staged \
             as {name}: `git -C {} add` what belongs to it, delete the rest (such as .rej files), then run it again.",
            tree.display(),
            unstaged
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n  "),
            tree.display()
        );
    }

    let current = head(sh, &tree)?;
    let session = am_in_progress(&tree);
    if current == stop.base {
        if !session {
            bail!(
                "{name} is not committed, and no `git am` session holds it any more (aborted or skipped by hand?). \
                 Make its change, commit it, and run --continue again; or `cargo xtask patch apply --host {h} --abort` \
                 to start over."
            );
        }
        if edits.is_empty() {
            bail!(
                "nothing is staged for {name}: resolve it, `git -C {} add` the files, then run --continue again. \
                 To drop the patch instead, remove it from patches/{h}/series, then `cargo xtask patch apply --host {h} --abort` \
                 and `cargo xtask patch apply --host {h}`.",
                tree.display()
            );
        }
        let out = git(sh, &tree)
            .args(["am", "--continue"])
            .ignore_status()
            .output()?;
        if !out.status.success() {
            bail!(
                "git am --continue failed for {name}:\n  {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    } else {
        let on_top = git(sh, &tree)
            .args(["merge-base", "--is-ancestor", &stop.base, &current])
            .ignore_status()
            .output()?
            .status
            .success();
        if !on_top {
            bail!(
                "HEAD {current} does not hold the patches before {name} (commit {}): the tree was rewound. \
                 `cargo xtask patch apply --host {h} --abort` starts over.",
                stop.base
            );
        }
        if !edits.is_empty() {
            bail!(
                "{name} is committed (HEAD {current}), but the working tree {} also has staged changes:\n  {}\n\
                 Commit or discard them, then run --continue again.",
                tree.display(),
                edits.join("\n  ")
            );
        }
        if session {
            // The user committed the resolution: the session has nothing left to do.
            git(sh, &tree).args(["am", "--quit"]).run()?;
        }
    }

    let mut resolved = stop.resolved.clone();
    resolved.push(name);
    let rest = stop.not_applied().len();
    step(format!("applying the remaining {rest} patch(es)"));
    match apply_patches(
        sh,
        &tree,
        &series,
        stop.failed + 1,
        OnFailure::LeaveForResolution,
    )? {
        Applied::Complete(new_head) => {
            stamp.series = Some(series.digest.clone());
            stamp.head = Some(new_head);
            stamp.stopped = None;
            stamp.resolved = resolved;
            write_stamp(&stamp_path, &stamp)?;
            mount(project, host, &tree)?;
            println!(
                "all {} patch(es) applied; resolved by hand: {}.\nRun `cargo xtask patch export --host {h}` \
                 to write the fixed series to patches/{h}/ (apply and build refuse the tree until then).",
                series.patches.len(),
                stamp.resolved.join(", ")
            );
            Ok(tree)
        }
        Applied::Stopped(next) => Err(record_stop(
            sh, project, h, &mut stamp, &series, &next, resolved,
        )?),
    }
}

/// `patch apply --abort`: discards a stopped apply and returns the tree to the pristine commit.
pub fn abort_apply(sh: &Shell, project: &Project, host: &HostConfig) -> Result<()> {
    let h = &host.name;
    let tree = project.tree_dir(h);
    let Some(mut stamp) = read_tree_stamp(project, h) else {
        bail!("no working tree for {h} yet: run `cargo xtask patch apply --host {h}`");
    };
    let Some(stop) = stamp.stopped.take() else {
        bail!(
            "no stopped apply to abort in {}. `cargo xtask patch apply --host {h} --force` applies the series \
             afresh, discarding local work.",
            tree.display()
        );
    };
    let abandoned = head(sh, &tree)?;
    reset_to_pristine(sh, &tree)?;
    stamp = TreeStamp {
        pristine: stamp.pristine,
        ..TreeStamp::default()
    };
    write_stamp(&tree_stamp_path(project, h), &stamp)?;
    println!(
        "abandoned the apply stopped at {}: {} is back at the pristine commit (HEAD was {abandoned}).\n\
         `cargo xtask patch apply --host {h}` applies the series again.",
        stop.failed_patch(),
        tree.display()
    );
    Ok(())
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

/// What `patch export` wrote.
#[derive(Debug)]
pub struct Exported {
    /// The new series.
    pub patches: Vec<String>,
    /// Patches of the old series the export dropped (only with --force).
    pub dropped: Vec<String>,
}

/// `patch export`: the tree's commits over the pristine tag become patches/<host>/. Refuses
/// uncommitted changes always, and, unless `force`, any export that could drop or overwrite
/// patches the tree is not known to hold.
pub fn export(sh: &Shell, project: &Project, host: &HostConfig, force: bool) -> Result<Exported> {
    let h = &host.name;
    let tree = project.tree_dir(h);
    let stamp_path = tree_stamp_path(project, h);
    let Some(mut stamp) = read_tree_stamp(project, h) else {
        bail!("no working tree for {h} yet: run `cargo xtask patch apply --host {h}` first");
    };
    if am_in_progress(&tree) {
        let what = match &stamp.stopped {
            Some(stop) => format!(
                "{}; not in the tree yet: {}",
                stop.summary(),
                stop.patches[stop.failed..].join(", ")
            ),
            None => "a `git am` session".to_owned(),
        };
        bail!(
            "refusing to export {h}: the working tree {} is in the middle of an apply ({what}).\nResolve it, \
             `git add`, then `cargo xtask patch apply --host {h} --continue` (it applies the rest), then export; \
             or `cargo xtask patch apply --host {h} --abort`. --force cannot export a half-applied patch.",
            tree.display()
        );
    }
    let edits = local_edits(sh, &tree)?;
    if !edits.is_empty() {
        bail!(
            "the working tree {} has uncommitted changes:\n  {}\nexport takes commits only: commit them \
             (git -C {} commit -a) or discard them (git -C {} reset --hard), then export.",
            tree.display(),
            edits.join("\n  "),
            tree.display(),
            tree.display()
        );
    }
    let series = load_series(project, h)?;
    let scratch = project.scratch()?;
    let out = scratch.path().join("patches");
    let names = format_patches(sh, &tree, &out)?;
    let dropped: Vec<String> = series
        .patches
        .iter()
        .filter(|p| !names.contains(p))
        .cloned()
        .collect();

    // Why the tree may not hold the series in patches/: then writing it over patches/ loses work.
    let mut doubts = Vec::new();
    let mut remedy = format!(
        "`cargo xtask patch apply --host {h}` applies the series (it refuses to discard commits of yours); \
         make your change on top, commit, then export."
    );
    if let Some(stop) = &stamp.stopped {
        let rest = match stop.not_applied() {
            [] => String::new(),
            rest => format!(", so {} is not applied", rest.join(", ")),
        };
        doubts.push(format!(
            "the apply stopped at {} and was not continued{rest}",
            stop.summary()
        ));
        remedy = format!(
            "Once {} is resolved and committed, `cargo xtask patch apply --host {h} --continue` applies the rest; \
             then export.",
            stop.failed_patch()
        );
    } else if stamp.series.is_none() {
        doubts.push(format!(
            "no apply of the series has completed in {} (it was interrupted or aborted, or never ran)",
            tree.display()
        ));
    } else if stamp.series.as_deref() != Some(series.digest.as_str()) {
        doubts.push(format!(
            "patches/{h} changed since the tree was applied, so the tree lacks those changes"
        ));
    }
    if names.len() < series.patches.len() {
        doubts.push(format!(
            "the tree holds {} commit(s) over the pristine pin, the series {} patch(es)",
            names.len(),
            series.patches.len()
        ));
    }
    if !doubts.is_empty() {
        let loss = if dropped.is_empty() {
            format!("Exporting now would replace patches/{h} with the tree's commits.")
        } else {
            format!("Exporting now would drop:\n  {}", dropped.join("\n  "))
        };
        if !force {
            bail!(
                "refusing to export {h}: {}.\n{loss}\n{remedy}\nOr pass --force to export the tree as it is.",
                doubts.join("; ")
            );
        }
        note(format!("--force: {}", doubts.join("; ")));
    }

    let dir = project.patches_dir(h);
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
    let series = load_series(project, h)?;
    stamp.series = Some(series.digest);
    stamp.head = Some(head(sh, &tree)?);
    stamp.resolved.clear();
    stamp.stopped = None;
    write_stamp(&stamp_path, &stamp)?;
    Ok(Exported {
        patches: names,
        dropped: if doubts.is_empty() {
            Vec::new()
        } else {
            dropped
        },
    })
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
    if let Applied::Stopped(stop) = apply_patches(sh, &tree, &series, 0, OnFailure::Abort)? {
        bail!(
            "patch {} does not apply to the pinned tree:\n  {}\n`cargo xtask patch apply --host {}` leaves it \
             in the working tree for you to resolve, and says how to go on.",
            series.patches[stop.index],
            stop.errors,
            host.name
        );
    }
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

/// The `patches` line of `cargo xtask host status`: how the working tree stands to the series.
pub fn patch_state(sh: &Shell, project: &Project, host: &HostConfig) -> Result<String> {
    let h = &host.name;
    let Some(stamp) = read_tree_stamp(project, h) else {
        return Ok(format!(
            "working tree not created (cargo xtask patch apply --host {h})"
        ));
    };
    let tree = project.tree_dir(h);
    let current_head = head(sh, &tree)?;
    let series = match load_series(project, h) {
        Ok(series) => series,
        Err(err) => return Ok(format!("{err:#}")),
    };
    Ok(match (&stamp.stopped, &stamp.series) {
        (Some(stop), _) => {
            let changed = if stop.series == series.digest {
                ""
            } else {
                "; patches/ has changed since, so --abort, then patch apply"
            };
            format!(
                "apply failed at {}; resolve it, `git add`, then `cargo xtask patch apply --host {h} --continue` \
                 and `cargo xtask patch export --host {h}` (`--abort` returns to pristine){changed}",
                stop.summary()
            )
        }
        (None, None) => {
            "not applied (an apply was interrupted or aborted, or never ran)".to_owned()
        }
        (None, Some(applied)) if applied != &series.digest => {
            "out of date with patches/ (run patch apply)".to_owned()
        }
        (None, Some(_)) if !stamp.resolved.is_empty() => format!(
            "{} patch(es) applied; {} resolved by hand, not exported (run patch export)",
            series.patches.len(),
            stamp.resolved.join(", ")
        ),
        (None, Some(_)) if stamp.head.as_deref() != Some(current_head.as_str()) => format!(
            "{} patch(es) applied, plus commits not exported (run patch export)",
            series.patches.len()
        ),
        (None, Some(_)) => format!("{} patch(es) applied, up to date", series.patches.len()),
    })
}

/// Working-tree lines of `cargo xtask host status`.
pub fn print_tree_status(sh: &Shell, project: &Project, host: &HostConfig) -> Result<()> {
    let tree = project.tree_dir(&host.name);
    let state = patch_state(sh, project, host)?;
    if read_tree_stamp(project, &host.name).is_none() {
        println!("patches   {state}");
        return Ok(());
    }
    println!("tree      {}", tree.display());
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
